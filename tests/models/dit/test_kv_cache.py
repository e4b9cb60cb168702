"""Image-to-image through the functional KV cache vs the reference's GlmImageKVCache."""

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

from glmrl.models.dit import DiTKVCache, append_images, stack_slots
from tests.models.dit import torch_ref

TOL = 1e-4  # max abs, float32
TARGET = (8, 12)  # latent size of the image being generated


def source_pass(cfg, seed, height, width):
  """What the pipeline feeds the write pass for one source image: batch 1, no glyph tokens,
  timestep 0, target_size = the image's pixel size, 1-D prior ids."""
  x = torch_ref.t2i_inputs(cfg, seed, batch=1, height=height, width=width, text_len=0)
  return dict(x, prior_token_ids=x["prior_token_ids"][0], timestep=np.zeros((1,), np.float32),
              target_size=np.array([[8 * height, 8 * width]], np.int64))


def ref_write(ref_model, cfg, per_sample_sources):
  """The pipeline's loop: one write pass per source image, next_sample() after each sample."""
  caches = GlmImageKVCache(num_layers=cfg.num_layers)
  caches.set_mode("write")
  outs = []
  for sources in per_sample_sources:
    for src in sources:
      drop = np.zeros(src["prior_token_ids"].shape, bool)
      outs.append(torch_ref.ref_forward(ref_model, **src, prior_token_drop=drop, kv_caches=caches))
    caches.next_sample()
  return caches, outs


def ref_cfg_step(ref_model, caches, target):
  """One denoising step as the pipeline runs it: conditional (read), unconditional (skip)."""
  ids = target["prior_token_ids"]
  caches.set_mode("read")
  cond = torch_ref.ref_forward(ref_model, **target, prior_token_drop=np.zeros(ids.shape, bool), kv_caches=caches)
  caches.set_mode("skip")
  uncond = torch_ref.ref_forward(ref_model, **target, prior_token_drop=np.ones(ids.shape, bool), kv_caches=caches)
  return cond, uncond


def our_cfg_step(model, cache, target):
  cond, cache_after = torch_ref.forward(model, target, kv_cache=cache, cache_mode="read")
  uncond, _ = torch_ref.forward(model, target, prior_token_drop=True, kv_cache=cache, cache_mode="skip")
  for a, b in zip(jax.tree.leaves(cache_after), jax.tree.leaves(cache)):
    np.testing.assert_array_equal(a, b)
  return cond, uncond


def our_write(model, src, cache=None):
  out, cache = torch_ref.forward(model, src, kv_cache=cache, cache_mode="write")
  return out, cache


def test_one_source_per_sample(model, ref_model, tiny_cfg):
  """Two samples with one 8x8 source image each; ours writes both slots in one batched pass."""
  srcs = [source_pass(tiny_cfg, 10 + i, 8, 8) for i in range(2)]
  caches, ref_outs = ref_write(ref_model, tiny_cfg, [[s] for s in srcs])

  batched = {k: np.stack([s[k] for s in srcs]) if k == "prior_token_ids" else np.concatenate([s[k] for s in srcs])
             for k in srcs[0]}
  out, cache = our_write(model, batched)
  assert isinstance(cache, DiTKVCache) and cache.k.shape == (tiny_cfg.num_layers, 2, 16, 2, 16)
  assert bool(jnp.all(cache.valid))
  assert torch_ref.max_abs(out, np.concatenate(ref_outs)) < TOL
  # The batched write equals per-sample writes put side by side.
  singles = stack_slots([our_write(model, s)[1] for s in srcs])
  for a, b in zip(jax.tree.leaves(singles), jax.tree.leaves(cache)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=1e-5)

  target = torch_ref.t2i_inputs(tiny_cfg, seed=20, batch=2, height=TARGET[0], width=TARGET[1], text_len=5)
  want_cond, want_uncond = ref_cfg_step(ref_model, caches, target)
  got_cond, got_uncond = our_cfg_step(model, cache, target)
  assert torch_ref.max_abs(got_cond, want_cond) < TOL
  assert torch_ref.max_abs(got_uncond, want_uncond) < TOL
  # The cache matters: reading it differs from not having it.
  assert torch_ref.max_abs(got_cond, torch_ref.forward(model, target)) > 1e-3


def test_two_sources_in_one_slot_serve_repeated_batch(model, ref_model, tiny_cfg):
  """One sample with two source images of different sizes (appended in one slot), read by a
  batch of 2 (num_images_per_prompt=2: the slot is broadcast)."""
  srcs = [source_pass(tiny_cfg, 30, 8, 8), source_pass(tiny_cfg, 31, 4, 8)]
  caches, ref_outs = ref_write(ref_model, tiny_cfg, [srcs])
  out_a, cache = our_write(model, srcs[0])
  out_b, cache = our_write(model, srcs[1], cache)
  assert cache.k.shape[1:3] == (1, 16 + 8)
  assert torch_ref.max_abs(out_a, ref_outs[0]) < TOL
  assert torch_ref.max_abs(out_b, ref_outs[1]) < TOL

  target = torch_ref.t2i_inputs(tiny_cfg, seed=32, batch=2, height=TARGET[0], width=TARGET[1], text_len=5)
  want_cond, want_uncond = ref_cfg_step(ref_model, caches, target)
  got_cond, got_uncond = our_cfg_step(model, cache, target)
  assert torch_ref.max_abs(got_cond, want_cond) < TOL
  assert torch_ref.max_abs(got_uncond, want_uncond) < TOL


def test_slots_repeat_over_batch(model, ref_model, tiny_cfg):
  """Two slots read by a batch of 4: slot i serves rows 2i, 2i+1 (the reference's repeat)."""
  srcs = [source_pass(tiny_cfg, 40 + i, 8, 8) for i in range(2)]
  caches, _ = ref_write(ref_model, tiny_cfg, [[s] for s in srcs])
  cache = stack_slots([our_write(model, s)[1] for s in srcs])
  target = torch_ref.t2i_inputs(tiny_cfg, seed=42, batch=4, height=TARGET[0], width=TARGET[1], text_len=5)
  caches.set_mode("read")
  want = torch_ref.ref_forward(ref_model, **target, prior_token_drop=np.zeros(target["prior_token_ids"].shape, bool),
                               kv_caches=caches)
  got, _ = torch_ref.forward(model, target, kv_cache=cache, cache_mode="read")
  assert torch_ref.max_abs(got, want) < TOL


def test_slots_of_different_lengths(model, ref_model, tiny_cfg):
  """Samples whose sources differ in size: slots padded with valid=False. The reference cannot
  batch these, so each row is checked against a batch-1 reference step."""
  sizes = [(8, 8), (4, 8)]
  srcs = [source_pass(tiny_cfg, 50 + i, h, w) for i, (h, w) in enumerate(sizes)]
  cache = stack_slots([our_write(model, s)[1] for s in srcs])
  assert cache.k.shape[2] == 16
  np.testing.assert_array_equal(np.asarray(cache.valid), [[True] * 16, [True] * 8 + [False] * 8])
  target = torch_ref.t2i_inputs(tiny_cfg, seed=52, batch=2, height=TARGET[0], width=TARGET[1], text_len=5)
  got, _ = torch_ref.forward(model, target, kv_cache=cache, cache_mode="read")
  for row, src in enumerate(srcs):
    caches, _ = ref_write(ref_model, tiny_cfg, [[src]])
    caches.set_mode("read")
    one = {k: v[row:row + 1] for k, v in target.items()}
    want = torch_ref.ref_forward(ref_model, **one, prior_token_drop=np.zeros(one["prior_token_ids"].shape, bool),
                                 kv_caches=caches)
    assert torch_ref.max_abs(got[row:row + 1], want) < TOL


def test_cache_errors(model, tiny_cfg):
  target = torch_ref.t2i_inputs(tiny_cfg, seed=60, batch=3, height=4, width=4, text_len=2)
  src = source_pass(tiny_cfg, 61, 8, 8)  # a shape already compiled by the tests above
  _, cache = our_write(model, src)
  two = stack_slots([cache, cache])
  with pytest.raises(ValueError, match="needs a kv_cache"):
    model(**target, cache_mode="read")
  with pytest.raises(ValueError, match="without cache_mode"):
    model(**target, kv_cache=cache)
  with pytest.raises(ValueError, match="multiple of the slots"):
    model(**target, kv_cache=two, cache_mode="read")
  with pytest.raises(ValueError, match="appends to each slot"):
    model(**target, kv_cache=two, cache_mode="write")
  bad = DiTKVCache(cache.k[:1], cache.v[:1], cache.valid)
  with pytest.raises(ValueError, match="layers/heads/head_dim"):
    model(**target, kv_cache=bad, cache_mode="read")
  with pytest.raises(ValueError, match="slots"):
    append_images(cache, two)
