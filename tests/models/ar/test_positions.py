"""3D positions equal transformers' get_rope_index and its cached decode positions exactly."""

import glmrl  # noqa: F401

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import GlmImageConfig
from transformers.models.glm_image.modeling_glm_image import GlmImageModel

from glmrl.models.ar import positions
from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.prompt import PromptProcessor
from tests.fixtures.tiny_glm_image import write_processor

CFG = ARConfig.tiny()


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
  return PromptProcessor.from_pretrained(write_processor(tmp_path_factory.mktemp("ckpt")))


@pytest.fixture(scope="module")
def reference():
  torch.manual_seed(0)
  return GlmImageModel(GlmImageConfig(**CFG.to_hf())).eval()


def _reference_positions(model, input_ids, valid, grid_thw, images_per_sample):
  pos, _ = model.get_rope_index(torch.from_numpy(np.asarray(input_ids, np.int64)),
                                image_grid_thw=torch.from_numpy(grid_thw),
                                images_per_sample=torch.from_numpy(images_per_sample),
                                attention_mask=torch.from_numpy(valid.astype(np.int64)))
  return pos.numpy(), model._cached_decode_position_ids.numpy()


def _ours(batch):
  return positions.rope_index(batch.input_ids, batch.valid, batch.image_grid_thw, batch.images_per_sample,
                              image_start_id=CFG.image_start_token_id, image_end_id=CFG.image_end_token_id)


def _check(batch, reference):
  pos, decode = _ours(batch)
  ref_pos, ref_decode = _reference_positions(reference, batch.input_ids, batch.valid, batch.image_grid_thw,
                                             batch.images_per_sample)
  assert pos.shape == (3, *batch.input_ids.shape) and pos.dtype == np.int32
  assert decode.shape == (batch.input_ids.shape[0], 3, batch.layout.num_new_tokens)
  np.testing.assert_array_equal(pos, ref_pos)
  np.testing.assert_array_equal(decode, ref_decode)
  return pos, decode


@pytest.mark.parametrize("height,width", [(64, 64), (128, 64), (96, 256)])
def test_text_to_image_batched_left_padding(processor, reference, height, width):
  batch = processor(["a red cat", "a small blue house on the tree , photo", "dog"], height, width,
                    pad_to_multiple_of=16)
  assert not batch.valid.all()
  pos, decode = _check(batch, reference)
  # Samples differ only by their prompt length: generated positions shift with it.
  lengths = batch.valid.sum(1)
  np.testing.assert_array_equal(decode[1] - decode[0], np.full_like(decode[0], lengths[1] - lengths[0]))


def test_image_to_image_batched(processor, reference):
  rng = np.random.default_rng(1)
  images = [[Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))],
            [Image.fromarray(rng.integers(0, 256, (48, 96, 3), dtype=np.uint8))]]
  batch = processor(["make it red", "a painting of the house"], 64, 96, images=images)
  assert not batch.valid.all()
  _check(batch, reference)


def test_image_to_image_two_condition_images(processor, reference):
  rng = np.random.default_rng(2)
  images = [[Image.fromarray(rng.integers(0, 256, (64, 32, 3), dtype=np.uint8)),
             Image.fromarray(rng.integers(0, 256, (40, 64, 3), dtype=np.uint8))]]
  batch = processor(["make it red"], 128, 128, images=images)
  _check(batch, reference)


def test_hand_built_ids(reference):
  """Ids without a tokenizer: text, a 3x2 condition image, text, then generation of a 2x4 grid."""
  s, e, img = CFG.image_start_token_id, CFG.image_end_token_id, CFG.image_token_id
  row = [90, 91, s] + [img] * 6 + [e, 92, 93, 94, s]
  ids = np.asarray([[CFG.text.pad_token_id] * 3 + row[:-4] + [s], row], np.int32)
  valid = np.asarray([[False] * 3 + [True] * 11, [True] * 14])
  grids = np.asarray([[1, 3, 2], [1, 2, 4], [1, 3, 2], [1, 2, 4]], np.int64)
  per_sample = np.asarray([2, 2], np.int64)
  pos, decode = positions.rope_index(ids, valid, grids, per_sample, image_start_id=s, image_end_id=e)
  ref_pos, ref_decode = _reference_positions(reference, ids, valid, grids, per_sample)
  np.testing.assert_array_equal(pos, ref_pos)
  np.testing.assert_array_equal(decode, ref_decode)
  # Text 0..2, image grid rows/cols from 3, text resumes at 3 + max(3, 2) = 6.
  np.testing.assert_array_equal(pos[:, 1, :5], [[0, 1, 2, 3, 3], [0, 1, 2, 3, 3], [0, 1, 2, 3, 4]])
  full = positions.sequence_positions(pos, decode)
  assert full.shape == (3, 2, 14 + 9)
  np.testing.assert_array_equal(full[:, :, 14:], np.transpose(decode, (1, 0, 2)))


def test_bad_input_raises():
  ids = np.zeros((2, 4), np.int32)
  with pytest.raises(ValueError, match="sums to 3"):
    positions.rope_index(ids, ids > -1, np.ones((2, 3)), [1, 2], image_start_id=64, image_end_id=65)
  with pytest.raises(ValueError, match=r"must both be \[B, L\]"):
    positions.rope_index(ids, np.ones((2, 5), bool), np.ones((2, 3)), [1, 1], image_start_id=64, image_end_id=65)
  with pytest.raises(ValueError, match="batch of 2"):
    positions.rope_index(ids, ids > -1, np.ones((3, 3)), [3], image_start_id=64, image_end_id=65)
