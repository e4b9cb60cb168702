"""The `clip_score` reward end to end: converted tiny CLIP folder -> RewardComposer -> scores,
against transformers (CLIPImageProcessor + CLIPTokenizer + CLIPModel).

Tolerances on the score (100 x cosine): 1e-3 when the images need no resize (preprocessing is then
exact, so this is 1e-5 on the cosine); 0.05 (5e-4 on the cosine) with a bicubic resize, whose PIL
fixed-point rounding the on-device resize does not reproduce (tests/models/clip/test_preprocess.py).
"""

import glmrl  # noqa: F401

import jax
import numpy as np
import pytest

from glmrl import rewards
from glmrl.models.clip.embedder import cached_embedder
from glmrl.rewards import RewardComposer
from glmrl.rewards import clip_score as clip_score_lib
from tests.models.clip import tiny

PROMPTS = ["a cat", "the dog", "a cat and the dog", "a cat"]


@pytest.fixture(scope="module")
def setup():
  folder, ref = tiny.converted("legacy")
  composer = RewardComposer([{"name": "clip_score", "weight": 0.5, "kwargs": {"ckpt_dir": str(folder)}},
                             {"name": "brightness", "weight": 1.0}])
  return folder, ref, composer


def reference_scores(ref, images, prompts, scale=100.0):
  img, txt = tiny.reference_embeddings(ref, images, prompts)
  return scale * np.sum(img * txt, axis=-1)


def test_matches_transformers_without_resize(setup):
  _, ref, composer = setup
  images = tiny.random_images((4, 32, 40), seed=1)  # shortest side already 32: crop only
  total, comps = composer(images, PROMPTS)
  want = reference_scores(ref, images, PROMPTS)
  np.testing.assert_allclose(comps["clip_score"], want, rtol=0, atol=1e-3)
  np.testing.assert_allclose(total, 0.5 * want + comps["brightness"], rtol=0, atol=1e-3)
  assert comps["clip_score"][0] != comps["clip_score"][3]  # same prompt, different images


def test_matches_transformers_with_resize(setup):
  _, ref, composer = setup
  images = tiny.random_images((4, 60, 45), seed=2)
  _, comps = composer(images, PROMPTS)
  np.testing.assert_allclose(comps["clip_score"], reference_scores(ref, images, PROMPTS), rtol=0, atol=0.05)


def test_prepared_text_embeddings_inside_a_callers_jit(setup):
  """As the rollout does: prepare on the host, then score inside one jit with prompts=None."""
  folder, ref, composer = setup
  images = tiny.random_images((4, 32, 32), seed=3)
  embedder = cached_embedder(str(folder))
  calls = []
  embed_text = embedder._embed_text
  embedder._embed_text = lambda *a: calls.append(a[1].shape) or embed_text(*a)
  try:
    prepared = composer.prepare(PROMPTS, {})
    again = composer.prepare(list(reversed(PROMPTS)), {})
  finally:
    embedder._embed_text = embed_text
  assert set(prepared) == {clip_score_lib.TEXT_EMBEDS} and prepared[clip_score_lib.TEXT_EMBEDS].shape == (4, 16)
  assert len(calls) <= 1  # each prompt embedded at most once, across calls
  np.testing.assert_array_equal(np.asarray(again[clip_score_lib.TEXT_EMBEDS]),
                                np.asarray(prepared[clip_score_lib.TEXT_EMBEDS])[::-1])
  fused = jax.jit(lambda x, m: composer.combine(composer.jax_scores(x, m)))
  total = fused(images, prepared)
  want_total, _ = composer(images, PROMPTS)
  np.testing.assert_allclose(np.asarray(total), want_total, rtol=0, atol=1e-4)
  with pytest.raises(ValueError, match=r"needs metadata\['clip_score/text_embeds'\].*RewardComposer.prepare"):
    jax.jit(lambda x: composer.jax_scores(x, {}))(images)


def test_scale_and_direct_use(setup):
  folder, ref, _ = setup
  images = tiny.random_images((2, 32, 32), seed=4)
  reward = rewards.get("clip_score").build(ckpt_dir=str(folder), scale=clip_score_lib.FLOW_GRPO_SCALE)
  # Given the prompts (outside jit, or at trace time as here) the reward embeds them itself.
  got = np.asarray(jax.jit(lambda x: reward.fn(x, PROMPTS[:2], {}))(images))
  np.testing.assert_allclose(got, reference_scores(ref, images, PROMPTS[:2], 100 / 30), rtol=0, atol=1e-4)


def test_config_errors(setup, tmp_path):
  folder, _, _ = setup
  with pytest.raises(ValueError, match="scale=nan must be a finite number"):
    RewardComposer([{"name": "clip_score", "weight": 1.0, "kwargs": {"ckpt_dir": str(folder), "scale": float("nan")}}])
  with pytest.raises(ValueError, match="reward 'clip_score' takes no argument 'ckpt'"):
    RewardComposer([{"name": "clip_score", "weight": 1.0, "kwargs": {"ckpt": str(folder)}}])
  with pytest.raises(ValueError, match="is not a directory"):
    RewardComposer([{"name": "clip_score", "weight": 1.0, "kwargs": {"ckpt_dir": str(tmp_path / "nope")}}])
  reward = rewards.get("clip_score").build(ckpt_dir=str(folder))
  with pytest.raises(ValueError, match="must be uint8"):
    reward.fn(np.zeros((1, 32, 32, 3), np.float32), ["a"], {})
  with pytest.raises(ValueError, match=r"text embeddings of shape \(2, 16\), expected \(1, 16\)"):
    reward.fn(np.zeros((1, 32, 32, 3), np.uint8), None, {clip_score_lib.TEXT_EMBEDS: np.zeros((2, 16))})
  with pytest.raises(ValueError, match="is model-backed"):
    rewards.get("clip_score")(np.zeros((1, 32, 32, 3), np.uint8), ["a"], {})
