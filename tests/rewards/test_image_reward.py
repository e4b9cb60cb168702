"""The `image_reward` reward (ImageReward) against transformers' BLIP on a tiny random model saved as ImageReward
releases its checkpoint (BLIP's own key names, the fused ViT qkv, the position-id buffer, the unused contrastive
projections), converted by `python -m checkpoints_convert.image_reward` as users run it
(tests/rewards/preference_models.py).

The `image-reward` package itself cannot run here: its BLIP text encoder (`med.py`) imports helpers transformers 5
removed (`apply_chunking_to_forward` from `modeling_utils`), its ViT needs timm 0.6 and fairscale, and its
constructor downloads bert-base-uncased's tokenizer. transformers' `BlipVisionModel` and `BlipTextModel` are the
same modules ported from BLIP's code (the text encoder under the same names); the head and the normalisation are
`ImageReward.score`'s, written out there.

Tolerances: scores within 1e-5 relative of the reference's on the same pixels (measured 2.6e-7 at most); the
preprocessing against PIL's resize and torchvision's crop within one uint8 step of a normalised pixel, as
tests/models/clip/test_preprocess.py measures PIL's fixed-point filter.
"""

import glmrl  # noqa: F401

import jax
import numpy as np
import pytest
from flax import nnx

from checkpoints_convert import image_reward as image_reward_convert
from glmrl.models.blip.config import ImageRewardConfig
from glmrl.models.blip.model import ImageRewardModel
from glmrl.models.clip.preprocess import OPENAI_CLIP_STD
from glmrl.models.init_rngs import InitRngs
from glmrl.rewards import RewardComposer
from glmrl.rewards import image_reward as image_reward_lib
from tests.rewards import preference_models

STEP = 1 / 255 / min(OPENAI_CLIP_STD)


@pytest.fixture(scope="module")
def folder(shared_runs):
  return preference_models.image_reward(shared_runs)


def test_scores_are_image_rewards_through_the_composer(folder):
  composer = RewardComposer([{"name": "image_reward", "weight": 1.0, "kwargs": {
      "ckpt_dir": str(folder / "converted"), "tokenizer_dir": str(folder / "bert")}}], group_size=2)
  prepared = composer.prepare(preference_models.IR_PROMPTS)
  reference = np.load(folder / "reference.npz")
  # ImageReward's tokenization: [CLS] words [SEP], padded to 35.
  np.testing.assert_array_equal(prepared[image_reward_lib.PROMPT_IDS], reference["ids"])
  np.testing.assert_array_equal(prepared[image_reward_lib.PROMPT_MASK], reference["mask"])
  assert reference["mask"].sum(1).tolist() == [9, 6, 7, 3]
  score = jax.jit(composer.jax_scores)
  for h, w in preference_models.IR_SIZES:
    want = reference[f"scores_{h}x{w}"]
    assert np.ptp(want) > 1e-2  # the scores differ by ~1000x the tolerance
    got = np.asarray(score(reference[f"images_{h}x{w}"], prepared)["image_reward"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"{h}x{w}")
    np.testing.assert_allclose(reference[f"pixels_{h}x{w}"], reference[f"pil_pixels_{h}x{w}"], rtol=0,
                               atol=STEP * 1.01, err_msg=f"{h}x{w}")
  # Called directly with its prompts (tokenized here), as outside a training step.
  fn = composer.entries[0]["fn"]
  images = reference["images_64x64"]
  np.testing.assert_allclose(np.asarray(fn(images, preference_models.IR_PROMPTS, {})),
                             reference["scores_64x64"], rtol=1e-5, atol=1e-7)


def test_full_size_has_the_released_models_parameters():
  """The released layout against transformers' BLIP modules of the same sizes (built on the meta device) plus
  ImageReward's MLP; BLIP_Pretrain's unused contrastive projections are left out."""
  import torch
  from transformers import BlipTextConfig, BlipTextModel, BlipVisionConfig, BlipVisionModel

  abstract = nnx.eval_shape(lambda: ImageRewardModel(ImageRewardConfig.full(), rngs=InitRngs(0)))
  ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  with torch.device("meta"):
    vision = BlipVisionModel(BlipVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                              num_attention_heads=16, image_size=224, patch_size=16))
    text = BlipTextModel(BlipTextConfig(vocab_size=30524, encoder_hidden_size=1024, is_decoder=True),
                         add_pooling_layer=False)
  widths = (768, 1024, 128, 64, 16, 1)
  mlp = sum(a * b + b for a, b in zip(widths, widths[1:]))
  want = sum(p.numel() for m in (vision, text) for p in m.parameters()) + mlp
  assert ours == want == 446_206_689


def test_bad_checkpoints_are_refused_before_anything_is_written(folder, tmp_path, capsys):
  import torch

  state = torch.load(folder / "ImageReward.pt")
  cases = {
      "extra": ({**state, "blip.logit_scale": torch.zeros(())}, "unexpected (1): blip.logit_scale"),
      "missing": ({k: v for k, v in state.items() if not k.endswith("blocks.1.mlp.fc2.bias")},
                  "missing (1): blip.visual_encoder.blocks.1.mlp.fc2.bias"),
      "wrapped": ({f"module.{k}": v for k, v in state.items()}, "every key starts with 'module.'"),
      "other": ({"layers.0.weight": torch.zeros(2, 2)}, "not ImageReward's state_dict"),
      "absent": (None, "no weights file"),
  }
  for name, (bad, message) in cases.items():
    path = tmp_path / f"{name}.pt"
    if bad is not None:
      torch.save(bad, path)
    code = image_reward_convert.main([f"--checkpoint={path}", f"--out_dir={tmp_path / name}"])
    err = capsys.readouterr().err
    # The shared check lists every unexpected, missing and mis-shaped key under the file's name.
    assert code == 2 and err.startswith("error: ") and message in err and "Traceback" not in err, (name, err)
    assert not (tmp_path / name).exists()
  code = image_reward_convert.main([f"--checkpoint={folder / 'ImageReward.pt'}", f"--out_dir={tmp_path / 'x'}",
                                    f"--med_config={tmp_path / 'nowhere.json'}"])
  assert code == 2 and "is not a file (ImageReward's med_config.json)" in capsys.readouterr().err
  with pytest.raises(ValueError, match="holds no BERT tokenizer"):
    image_reward_lib.image_reward_factory(str(folder / "converted"), str(tmp_path))
  with pytest.raises(ValueError, match="is not a directory"):
    image_reward_lib.image_reward_factory(str(tmp_path / "nowhere"), str(folder / "bert"))
