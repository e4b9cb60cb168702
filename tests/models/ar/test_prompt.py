"""Prompt batches equal what transformers' GlmImageProcessor gives the diffusers pipeline."""

import glmrl  # noqa: F401

import numpy as np
import pytest
from PIL import Image
from transformers import GlmImageProcessor

from glmrl.models.ar import prompt as prompt_lib
from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.prompt import GenerationLayout, PromptProcessor
from tests.fixtures.tiny_glm_image import write_processor

CFG = ARConfig.tiny()
PROMPTS = ["a red cat on the house", "dog", "a photo of a small blue house with a tree , the sign says 'hello'"]


@pytest.fixture(scope="module", params=[(), ("[gMASK]", "<sop>")], ids=["plain", "prefix_tokens"])
def processors(request, tmp_path_factory):
  folder = write_processor(tmp_path_factory.mktemp("ckpt"), prefix_tokens=request.param)
  return PromptProcessor.from_pretrained(folder.parent), GlmImageProcessor.from_pretrained(folder)


def _reference(ref, prompts, height, width, images=None):
  """The message layout and call of diffusers' GlmImagePipeline.generate_prior_tokens."""
  messages = []
  for i, p in enumerate(prompts):
    content = [{"type": "image", "image": im} for im in (images[i] if images else [])]
    messages.append([{"role": "user", "content": content + [{"type": "text", "text": p}]}])
  out = ref.apply_chat_template(messages, tokenize=True, padding=len(prompts) > 1, target_h=height,
                                target_w=width, return_dict=True, return_tensors="pt")
  return {k: v.numpy() for k, v in out.items()}


def _check(batch, ref_out):
  np.testing.assert_array_equal(batch.input_ids, ref_out["input_ids"])
  np.testing.assert_array_equal(batch.valid, ref_out["attention_mask"].astype(bool))
  np.testing.assert_array_equal(batch.image_grid_thw, ref_out["image_grid_thw"])
  np.testing.assert_array_equal(batch.images_per_sample, ref_out["images_per_sample"])
  assert batch.input_ids.dtype == np.int32 and batch.valid.dtype == bool


@pytest.mark.parametrize("height,width", [(64, 64), (1024, 512), (96, 352)])
def test_text_to_image_matches_reference(processors, height, width):
  ours, ref = processors
  batch = ours(PROMPTS, height, width)
  _check(batch, _reference(ref, PROMPTS, height, width))
  assert batch.pixel_values is None and batch.layout.text_to_image
  # Every row ends with the image-start token that opens generation.
  assert (batch.input_ids[:, -1] == CFG.image_start_token_id).all()
  single = ours(PROMPTS[1:2], height, width)
  _check(single, _reference(ref, PROMPTS[1:2], height, width))


def test_image_to_image_matches_reference(processors):
  ours, ref = processors
  rng = np.random.default_rng(0)
  images = [[Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))],
            [Image.fromarray(rng.integers(0, 256, (40, 96, 3), dtype=np.uint8), mode="RGB")]]
  batch = ours(PROMPTS[:2], 128, 64, images=images)
  ref_out = _reference(ref, PROMPTS[:2], 128, 64, images)
  _check(batch, ref_out)
  np.testing.assert_array_equal(batch.pixel_values, ref_out["pixel_values"])
  assert not batch.layout.text_to_image
  n_source = int(batch.source_grid_thw.prod(-1).sum())
  assert (batch.input_ids == CFG.image_token_id).sum() == n_source
  two = [[images[0][0], images[1][0]]]
  _check(ours(PROMPTS[2:], 64, 64, images=two), _reference(ref, PROMPTS[2:], 64, 64, two))


def test_grid_sizes_match_reference(processors):
  _, ref = processors
  for h, w in [(32, 32), (1024, 1024), (1152, 768), (2048, 512), (512, 2048), (96, 352)]:
    assert prompt_lib.grid_sizes(h, w) == ref._get_target_shape(height=h, width=w)


def test_layout():
  t2i = GenerationLayout.for_size(1152, 768, text_to_image=True)
  assert t2i.grids == ((19, 13), (36, 24)) and t2i.target_hw == (36, 24) and t2i.preview_hw == (19, 13)
  assert t2i.num_new_tokens == 19 * 13 + 36 * 24 + 1
  assert t2i.grid_slice(1) == slice(19 * 13, 19 * 13 + 36 * 24)
  np.testing.assert_array_equal(t2i.grid_thw(), [[1, 36, 24], [1, 19, 13]])
  i2i = GenerationLayout.for_size(64, 96, text_to_image=False)
  assert i2i.grids == ((2, 3),) and i2i.preview_hw is None and i2i.num_new_tokens == 7
  assert hash(t2i) != hash(i2i)


def test_pad_to_multiple_of(processors):
  ours, _ = processors
  batch = ours(PROMPTS, 64, 64, pad_to_multiple_of=64)
  plain = ours(PROMPTS, 64, 64)
  assert batch.input_ids.shape[1] == 64
  np.testing.assert_array_equal(batch.input_ids[:, -plain.input_ids.shape[1]:], plain.input_ids)
  assert (batch.input_ids[~batch.valid] == ours.pad_token_id).all()


def test_bad_input_raises(processors):
  ours, _ = processors
  with pytest.raises(ValueError, match="height=100 must be a positive multiple of 32"):
    ours(PROMPTS, 100, 64)
  with pytest.raises(ValueError, match="width=0"):
    ours(PROMPTS, 64, 0)
  with pytest.raises(ValueError, match="non-empty list of strings"):
    ours("a cat", 64, 64)
  image = Image.new("RGB", (64, 64))
  with pytest.raises(ValueError, match="same number"):
    ours(PROMPTS[:2], 64, 64, images=[[image], [image, image]])
  with pytest.raises(ValueError, match="2 image lists for 3 prompts"):
    ours(PROMPTS, 64, 64, images=[[image], [image]])
  with pytest.raises(ValueError, match="pad_to_multiple_of=0"):
    ours(PROMPTS, 64, 64, pad_to_multiple_of=0)
