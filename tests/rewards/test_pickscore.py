"""The `pickscore` reward: scale * exp(logit_scale) * cosine with the checkpoint's own logit scale,
on a tiny ViT-H/14-like CLIP (exact GELU, first-end-token pooling) converted from transformers.
Tolerance 1e-3 on exp(3.1) / 26 x cosine (images need no resize, so preprocessing is exact)."""

import glmrl  # noqa: F401

import jax
import numpy as np
import pytest

from glmrl.rewards import RewardComposer
from glmrl.rewards import pickscore as pickscore_lib
from tests.models.clip import tiny

PROMPTS = ["a dog", "the cat", "a dog", "cat and dog"]


@pytest.fixture(scope="module")
def setup():
  folder, ref = tiny.converted("gelu")
  return folder, ref


def test_flow_grpo_scaling_matches_transformers(setup):
  folder, ref = setup
  composer = RewardComposer([{"name": "pickscore", "weight": 1.0,
                              "kwargs": {"ckpt_dir": str(folder), "scale": pickscore_lib.FLOW_GRPO_SCALE}}],
                            group_size=2)
  images = tiny.random_images((4, 40, 32), seed=7)
  prepared = composer.prepare(PROMPTS)
  got = np.asarray(jax.jit(composer.jax_scores)(images, prepared)["pickscore"])
  img, txt = tiny.reference_embeddings(ref, images, PROMPTS)
  want = ref.logit_scale.exp().item() * np.sum(img * txt, axis=-1) / 26
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
  assert ref.logit_scale.item() == pytest.approx(3.1)  # the learned scale is used, not CLIP's 100
  _, comps = composer(images, PROMPTS)
  np.testing.assert_allclose(comps["pickscore"], got, rtol=0, atol=1e-5)


def test_separate_tokenizer_dir_and_errors(setup, tmp_path):
  """PickScore_v1 takes laion/CLIP-ViT-H-14's tokenizer: `tokenizer_dir` points at another folder."""
  folder, _ = setup
  tok_dir = tmp_path / "tok"
  tiny.tiny_tokenizer().save_pretrained(str(tok_dir))
  reward = pickscore_lib.pickscore_factory(str(folder), tokenizer_dir=str(tok_dir))
  assert set(reward.prepare(["a dog"], {})) == {pickscore_lib.TEXT_EMBEDS}
  with pytest.raises(ValueError, match="no CLIP tokenizer"):
    pickscore_lib.pickscore_factory(str(folder), tokenizer_dir=str(tmp_path)).prepare(["a dog"], {})
  with pytest.raises(ValueError, match="scale=True must be a finite number"):
    pickscore_lib.pickscore_factory(str(folder), scale=True)
