"""On-device preprocessing vs transformers' CLIPImageProcessor (its PIL backend; torchvision is not
installed, and the PIL path is what the released processors were built around).

Measured (see the module doc of glmrl.models.clip.preprocess): with no resize the outputs agree to
float rounding; with a bicubic resize PIL's fixed-point filter puts about 0.05-0.6% of the values one
uint8 step (1/255/std ~ 0.015) away, at most two steps, and the unit image embedding of a random
224-px model moves by at most ~1e-4. Asserted: <= 2 steps everywhere, <= 1% of values off, embeddings
within 5e-4, and 1e-6 without a resize.
"""

import glmrl  # noqa: F401

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from checkpoints_convert.maps.clip import RULES
from glmrl.models.clip import ClipModel, l2_normalize
from glmrl.models.clip.preprocess import OPENAI_CLIP_STD, ImageProcessing, center_crop_offsets, preprocess
from tests.models.clip import tiny
from tests.torch_port import port

STEP = 1 / 255 / min(OPENAI_CLIP_STD)
EMBED_ATOL = 5e-4


def reference(images, proc: ImageProcessing) -> np.ndarray:
  pil = CLIPImageProcessorPil(**proc.to_hf())
  return np.stack([pil(images=[im], return_tensors="np")["pixel_values"][0].transpose(1, 2, 0) for im in images])


@pytest.fixture(scope="module")
def model_224():
  base = tiny.config("legacy")
  cfg = dataclasses.replace(base, vision=dataclasses.replace(base.vision, image_size=224, patch_size=32))
  return port(tiny.reference_model(cfg), ClipModel, cfg, RULES)


@pytest.mark.parametrize("shape", [(4, 300, 400), (4, 256, 256), (2, 512, 384)])
def test_resize_crop_normalise_matches_clip_image_processor(shape, model_224):
  proc = ImageProcessing.full()
  images = tiny.random_images(shape, seed=shape[1])
  want = reference(images, proc)
  got = np.asarray(jax.jit(lambda x: preprocess(x, proc))(images))
  assert got.shape == want.shape == (shape[0], 224, 224, 3) and got.dtype == np.float32
  diff = np.abs(got - want)
  assert diff.max() <= 2 * STEP + 1e-5
  assert (diff > 1e-4).mean() <= 0.01
  embed = nnx.jit(lambda m, x: l2_normalize(m.image_features(x)))
  np.testing.assert_allclose(np.asarray(embed(model_224, jnp.asarray(got))),
                             np.asarray(embed(model_224, jnp.asarray(want))), rtol=0, atol=EMBED_ATOL)


def test_no_resize_is_exact_and_crop_offsets():
  # Already at the shortest edge: only the crop (of the long side), rescale and normalise remain.
  proc = ImageProcessing.tiny(32)
  images = tiny.random_images((2, 32, 45), seed=3)
  np.testing.assert_allclose(np.asarray(preprocess(images, proc)), reference(images, proc), rtol=0, atol=1e-6)
  tall = tiny.random_images((2, 41, 32), seed=4)
  np.testing.assert_allclose(np.asarray(preprocess(tall, proc)), reference(tall, proc), rtol=0, atol=1e-6)


def test_from_hf_configs():
  assert ImageProcessing.from_hf(ImageProcessing.full().to_hf()) == ImageProcessing.full()
  assert ImageProcessing.from_hf(CLIPImageProcessorPil().to_dict()) == ImageProcessing.full()
  # openai/clip-vit-large-patch14's preprocessor_config.json still uses int sizes.
  legacy = {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
            "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": list(OPENAI_CLIP_STD),
            "image_std": list(OPENAI_CLIP_STD), "resample": 3, "size": 224}
  proc = ImageProcessing.from_hf(legacy)
  assert (proc.shortest_edge, proc.crop_height, proc.crop_width) == (224, 224, 224)
  exact = ImageProcessing.from_hf({"size": {"height": 40, "width": 36}, "crop_size": {"height": 32, "width": 32}})
  assert exact.resized_hw(100, 50) == (40, 36)
  assert ImageProcessing.full().resized_hw(768, 1024) == (224, 298)
  assert ImageProcessing.full().resized_hw(1000, 300) == (746, 224)


def test_bad_inputs():
  proc = ImageProcessing.tiny(32)
  with pytest.raises(ValueError, match="must be uint8"):
    preprocess(np.zeros((1, 32, 32, 3), np.float32), proc)
  with pytest.raises(ValueError, match=r"must be \[B, H, W, 3\]"):
    preprocess(np.zeros((32, 32, 3), np.uint8), proc)
  with pytest.raises(ValueError, match="center crop 32x32 is larger"):
    preprocess(np.zeros((1, 20, 20, 3), np.uint8), dataclasses.replace(proc, do_resize=False))
  with pytest.raises(ValueError, match="resample=1"):
    ImageProcessing(resample=1)
  with pytest.raises(ValueError, match="give one of shortest_edge, longest_edge or both"):
    ImageProcessing(shortest_edge=None)


@pytest.mark.parametrize("shape", [(2, 40, 40), (2, 45, 30), (2, 30, 45), (2, 20, 26), (2, 28, 28)])
def test_longest_side_resize_and_padding_match_hpsv2s_float_preprocessing(shape):
  """HPS v2.1's preprocessing (`glmrl.rewards.hps.preprocessing`) against hpsv2's `preprocess_val` written with
  torch's resize (tests/rewards/open_clip_oracle.py): floats, no rounding, so within 1e-5 of its output."""
  from glmrl.rewards.hps import preprocessing
  from tests.rewards.open_clip_oracle import preprocess_val

  images = tiny.random_images(shape, seed=shape[1])
  want = np.stack([preprocess_val(im, 28).numpy().transpose(1, 2, 0) for im in images])
  got = np.asarray(jax.jit(lambda x: preprocess(x, preprocessing(28)))(images))
  assert got.shape == want.shape == (2, 28, 28, 3)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_resize_settings_are_checked():
  with pytest.raises(ValueError, match="give one of shortest_edge, longest_edge"):
    ImageProcessing(longest_edge=224)
  with pytest.raises(ValueError, match="pad or crop, not both"):
    ImageProcessing(shortest_edge=None, longest_edge=224, pad_size=224)
  with pytest.raises(ValueError, match="no CLIPImageProcessor counterpart"):
    ImageProcessing(shortest_edge=None, longest_edge=224, do_center_crop=False).to_hf()
  with pytest.raises(ValueError, match="no CLIPImageProcessor counterpart"):
    ImageProcessing(crop_rounding="round").to_hf()
  with pytest.raises(ValueError, match="crop_rounding='ceil' is not one of"):
    ImageProcessing(crop_rounding="ceil")


def test_crop_offsets_floor_as_clip_or_round_as_torchvision():
  """torchvision's CenterCrop (ImageReward's) starts at int(round(margin / 2)), Python's round: half to even."""
  assert [center_crop_offsets(224 + m, 224, 224, 224)[0] for m in (72, 73, 74, 75)] == [36, 36, 37, 37]
  assert [center_crop_offsets(224 + m, 224, 224, 224, "round")[0] for m in (72, 73, 74, 75)] == [36, 36, 37, 38]
