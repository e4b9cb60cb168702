"""Condition-image preprocessing equals transformers' GlmImageImageProcessorPil exactly."""

import glmrl  # noqa: F401

import numpy as np
import pytest
from PIL import Image
from transformers.models.glm_image.image_processing_pil_glm_image import GlmImageImageProcessorPil
from transformers.models.glm_image.image_processing_pil_glm_image import smart_resize as ref_smart_resize

from glmrl.models.ar import image_processing
from glmrl.models.ar.image_processing import ImageProcessorConfig


def _images():
  rng = np.random.default_rng(0)
  rgb = Image.fromarray(rng.integers(0, 256, (90, 130, 3), dtype=np.uint8))
  rgba = Image.fromarray(rng.integers(0, 256, (70, 50, 4), dtype=np.uint8), mode="RGBA")
  gray = Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8), mode="L")
  array = rng.integers(0, 256, (48, 120, 3), dtype=np.uint8)  # uint8 HWC, as glmrl.data loads them
  return [rgb, rgba, gray, array]


def _reference(cfg: ImageProcessorConfig, images):
  kwargs = {k: v for k, v in cfg.to_hf().items() if k != "image_processor_type"}
  out = GlmImageImageProcessorPil(**kwargs)(images=images, return_tensors="np")
  return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])


@pytest.mark.parametrize("cfg", [ImageProcessorConfig(), ImageProcessorConfig.full(), ImageProcessorConfig.tiny(),
                                 ImageProcessorConfig(patch_size=8, temporal_patch_size=2, merge_size=2,
                                                      min_pixels=64 * 64, max_pixels=96 * 96)],
                         ids=["class_defaults", "full", "tiny", "merge2_budget"])
def test_matches_reference_exactly(cfg):
  images = _images()
  pixel_values, grid_thw = image_processing.preprocess(images, cfg)
  ref_pixels, ref_grid = _reference(cfg, images)
  assert pixel_values.dtype == np.float32 and grid_thw.dtype == np.int64
  np.testing.assert_array_equal(grid_thw, ref_grid)
  np.testing.assert_array_equal(pixel_values, ref_pixels)
  counts = [image_processing.num_image_tokens(g, cfg) for g in grid_thw]
  assert sum(counts) * cfg.merge_size ** 2 == pixel_values.shape[0]


def test_smart_resize_matches_reference():
  for h, w in [(32, 32), (90, 130), (1000, 301), (2048, 2048), (4000, 1100), (57, 200)]:
    for factor, lo, hi in [(28, 56 * 56, 28 * 28 * 1280), (16, 512 * 512, 2048 * 2048), (4, 16 * 16, 64 * 64)]:
      assert image_processing.smart_resize(h, w, factor, lo, hi) == ref_smart_resize(h, w, factor, lo, hi)


def test_hf_config_round_trip():
  for cfg in (ImageProcessorConfig(), ImageProcessorConfig.full(), ImageProcessorConfig.tiny()):
    assert ImageProcessorConfig.from_hf(cfg.to_hf()) == cfg
  legacy = ImageProcessorConfig.from_hf({"min_pixels": 100, "max_pixels": 1000, "patch_size": 16})
  assert (legacy.min_pixels, legacy.max_pixels, legacy.patch_size) == (100, 1000, 16)


def test_bad_input_raises():
  cfg = ImageProcessorConfig.tiny()
  with pytest.raises(ValueError, match="smaller than the patch factor"):
    image_processing.preprocess([np.zeros((2, 40, 3), np.uint8)], cfg)
  with pytest.raises(ValueError, match="aspect ratio"):
    image_processing.preprocess([np.zeros((20, 100, 3), np.uint8)], cfg)
  with pytest.raises(ValueError, match="uint8"):
    image_processing.preprocess([np.zeros((20, 20, 3), np.float32)], cfg)
  with pytest.raises(ValueError, match="non-empty sequence"):
    image_processing.preprocess([], cfg)
  with pytest.raises(ValueError, match="patch_size=0"):
    ImageProcessorConfig(patch_size=0)
