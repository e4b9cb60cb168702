"""Glyph texts, tokens and embeddings against diffusers' GlmImagePipeline itself.

The oracle is the pipeline's own `get_glyph_texts` / `_get_glyph_embeds` / `encode_prompt`, called
on a stand-in `self` holding the ByT5 tokenizer and a tiny random torch T5EncoderModel whose
weights are copied into ours through the key map. Texts and tokens must be equal; embeddings
within 1e-4 max abs.
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers.pipelines.glm_image.pipeline_glm_image import GlmImagePipeline
from flax import nnx
from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

from checkpoints_convert.maps.glyph import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.models.glyph import (T5Encoder, T5EncoderConfig, encode_glyph_embeds, extract_glyph_texts,
                                tokenize_glyph_texts)

ATOL = 1e-4
PROMPTS = [
    "A poster titled 'GRAND OPENING' with \u201cToday only\u201d, \"50% off\" and \u300c\u5f00\u4e1a\u5927\u5409\u300d",
    "a red house on a hill",                                      # no quotes: the text ""
    "A sign that says \"Hello\"",                                 # one text: no <pad> prefix
    "two labels 'left' and 'right'",                              # even count: <pad> prefix
    "curly \u201cnested 'inner' quote\u201d and \u201cempty\u201d and \u201c\u201d",
    "don't do it, it's 'fine'",                                   # apostrophes pair up too
    "\u300c\u300d\u300c\u4e00\u300d\"\" 'caf\u00e9 \U0001F600'",   # empty spans, multi-byte UTF-8
    "",
]


@pytest.fixture(scope="module")
def setup():
  cfg = T5EncoderConfig.tiny()
  torch.manual_seed(0)
  ref = T5EncoderModel(T5Config(**cfg.to_hf())).eval()
  ours = nnx.eval_shape(lambda: T5Encoder(cfg, rngs=nnx.Rngs(0)))
  state = nnx.state(ours, nnx.Param)
  params = {flax_path_str(p): v for p, v in nnx.to_flat_state(state)}
  keymap = KeyMap(RULES)
  for key, tensor in ref.state_dict().items():
    path, transform = keymap.hf_to_flax(key)
    params[path].set_value(jnp.asarray(transform.to_flax(tensor.numpy())))
  assert all(isinstance(v.get_value(), jax.Array) for v in params.values())
  nnx.update(ours, state)

  calls = []

  def recording_encoder(input_ids, attention_mask):
    calls.append((input_ids.numpy(), attention_mask.numpy()))
    return ref(input_ids, attention_mask=attention_mask)

  tokenizer = ByT5Tokenizer()
  pipe = types.SimpleNamespace(tokenizer=tokenizer, text_encoder=recording_encoder, _execution_device="cpu")
  pipe.get_glyph_texts = lambda prompt: GlmImagePipeline.get_glyph_texts(pipe, prompt)
  pipe._get_glyph_embeds = lambda *a, **k: GlmImagePipeline._get_glyph_embeds(pipe, *a, **k)
  encode = nnx.jit(lambda m, tokens: encode_glyph_embeds(m, tokens))
  return pipe, calls, ours, encode


@torch.no_grad()  # as under the pipeline's __call__
def reference_embeds(pipe, prompts):
  return GlmImagePipeline._get_glyph_embeds(pipe, prompts, 2048, "cpu", torch.float32).numpy()


def test_extract_glyph_texts():
  want = GlmImagePipeline.get_glyph_texts(None, PROMPTS)
  assert [extract_glyph_texts(p) for p in PROMPTS] == want
  assert extract_glyph_texts("a red house") == []
  with pytest.raises(ValueError, match="prompt must be a str"):
    extract_glyph_texts(None)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_tokens_equal_reference(setup, prompt):
  pipe, calls, _, _ = setup
  calls.clear()
  reference_embeds(pipe, [prompt])
  (want_ids, want_mask), = calls
  tokens = tokenize_glyph_texts([prompt])
  assert np.array_equal(tokens.input_ids, want_ids)
  assert np.array_equal(tokens.attention_mask, want_mask)
  assert tokens.lengths.tolist() == [int(want_mask.sum())]


def test_glyph_embeds_batch(setup):
  pipe, _, ours, encode = setup
  want = reference_embeds(pipe, PROMPTS)
  tokens = tokenize_glyph_texts(PROMPTS)
  got = encode(ours, tokens)
  assert got.shape == want.shape
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=ATOL)
  # Left padding is exactly zero, as in the reference.
  assert not np.asarray(got)[~tokens.gather_mask].any()


def test_unconditional_prompt(setup):
  """CFG's negative prompt is "" for every sample (encode_prompt)."""
  pipe, _, ours, encode = setup
  with torch.no_grad():
    _, negative = GlmImagePipeline.encode_prompt(pipe, ["a 'b'", "c"], True, device="cpu", dtype=torch.float32)
  got = encode(ours, tokenize_glyph_texts(["", ""]))
  assert got.shape == tuple(negative.shape) == (2, 1, T5EncoderConfig.tiny().d_model)
  np.testing.assert_allclose(np.asarray(got), negative.numpy(), rtol=0, atol=ATOL)


def test_static_padding(setup):
  _, _, ours, encode = setup
  prompts = PROMPTS[:4]
  base = tokenize_glyph_texts(prompts)
  padded = tokenize_glyph_texts(prompts, pad_texts_to=base.input_ids.shape[0] + 3,
                                pad_length_to=base.input_ids.shape[1] + 5)
  assert padded.gather_mask.shape == base.gather_mask.shape
  np.testing.assert_allclose(np.asarray(encode(ours, padded)), np.asarray(encode(ours, base)), rtol=0, atol=1e-5)
  longer = tokenize_glyph_texts(prompts, pad_seq_to=base.gather_mask.shape[1] + 4)
  got = np.asarray(encode(ours, longer))
  assert not got[:, :4].any()
  np.testing.assert_allclose(got[:, 4:], np.asarray(encode(ours, base)), rtol=0, atol=1e-5)


def test_bad_inputs():
  with pytest.raises(ValueError, match="pad_length_to=2"):
    tokenize_glyph_texts(["'abc'"], pad_length_to=2)
  with pytest.raises(ValueError, match="pad_seq_to=1"):
    tokenize_glyph_texts(["'abc'"], pad_seq_to=1)
  with pytest.raises(ValueError, match="prompts is empty"):
    tokenize_glyph_texts([])
