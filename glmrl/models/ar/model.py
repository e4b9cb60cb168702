"""GLM-Image AR generator (transformers `GlmImageForConditionalGeneration`) in Flax NNX.

Input ids live in the text vocabulary, whose first `vision_vocab_size` ids are the image
tokens (codebook ids, then image start/end markers); `lm_head` predicts only those, so a
sampled id is fed back as an input id unchanged. Condition images enter the prompt as
`image_token_id` placeholders that `merge_image_tokens` replaces by their codebook ids.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.text import KVCache, TextDecoder
from glmrl.models.ar.vision import VisionEncoder
from glmrl.models.ar.vq import VectorQuantizer
from glmrl.sharding import EMBED, VOCAB

__all__ = ["GlmImageAR", "KVCache", "merge_image_tokens"]


def _check_tokens(input_ids_BxL, positions_3xBxL, mask_name: str, mask, mask_len: int | None = None):
  if input_ids_BxL.ndim != 2:
    raise ValueError(f"input_ids must be [B, L], got shape {input_ids_BxL.shape}")
  b, l = input_ids_BxL.shape
  if tuple(positions_3xBxL.shape) != (3, b, l):
    raise ValueError(f"positions must be [3, B, L] = {(3, b, l)}, got shape {tuple(positions_3xBxL.shape)}")
  want = (b, l if mask_len is None else mask_len)
  if tuple(mask.shape) != want:
    raise ValueError(f"{mask_name} must have shape {want}, got {tuple(mask.shape)}")


@functools.partial(nnx.jit, static_argnames=("h", "w"))
def _image_ids(model: "GlmImageAR", patches_XxF, h: int, w: int):
  return model.vq(model.visual(patches_XxF, h, w))


class GlmImageAR(nnx.Module):
  """Vision encoder + VQ (condition images), GLM-4 decoder and the vision-vocabulary head."""

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    t = cfg.text
    self.visual = VisionEncoder(cfg, rngs=rngs)
    self.vq = VectorQuantizer(cfg, rngs=rngs)
    self.text = TextDecoder(cfg, rngs=rngs)
    # Logits are accumulated and returned in float32 whatever the compute dtype.
    self.lm_head = nnx.Linear(t.hidden_size, t.vision_vocab_size, use_bias=False, dtype=cfg.dtype,
                              param_dtype=cfg.param_dtype, preferred_element_type=jnp.float32, rngs=rngs,
                              kernel_metadata={"out_sharding": (EMBED, VOCAB)})

  def embed(self, input_ids_BxL: jax.Array) -> jax.Array:
    return self.text.embed(input_ids_BxL)

  def hidden_states(self, input_ids_BxL, positions_3xBxL, valid_BxL) -> jax.Array:
    """Final-normed hidden states [B, L, D] of a causal forward without cache.

    `valid_BxL` is true for real tokens and false for (left) padding, which no query attends to.
    """
    _check_tokens(input_ids_BxL, positions_3xBxL, "valid", valid_BxL)
    return self.text(self.embed(input_ids_BxL), positions_3xBxL, valid_BxL)

  def __call__(self, input_ids_BxL, positions_3xBxL, valid_BxL) -> jax.Array:
    """Float32 logits [B, L, vision_vocab_size]."""
    return self.lm_head(self.hidden_states(input_ids_BxL, positions_3xBxL, valid_BxL)).astype(jnp.float32)

  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    """Zeroed cache of `max_len` slots per row (dtype defaults to the compute dtype)."""
    if batch <= 0 or max_len <= 0:
      raise ValueError(f"init_cache needs positive batch and max_len, got batch={batch}, max_len={max_len}")
    t = self.cfg.text
    shape = (batch, t.num_key_value_heads, max_len, t.head_dim)
    dtype = self.cfg.dtype if dtype is None else dtype
    layers = range(t.num_hidden_layers)
    return KVCache(k=tuple(jnp.zeros(shape, dtype) for _ in layers), v=tuple(jnp.zeros(shape, dtype) for _ in layers))

  def step(self, input_ids_BxL, positions_3xBxL, key_valid_BxT, cache: KVCache, start):
    """Cached forward of L new tokens written to slots [start, start+L); returns (h [B, L, D], cache).

    Query j attends to slots s <= start + j with key_valid_BxT[:, s] true. Prefill is a step at
    start=0 with the whole prompt, decoding a step with L=1; `start` may be traced. Slots past
    T are not checked: start + L must not exceed the cache length.
    """
    _check_tokens(input_ids_BxL, positions_3xBxL, "key_valid", key_valid_BxT, cache.max_len)
    b, l = input_ids_BxL.shape
    if cache.batch != b:
      raise ValueError(f"cache batch {cache.batch} does not match input batch {b}")
    if l > cache.max_len:
      raise ValueError(f"{l} new tokens do not fit a cache of {cache.max_len} slots")
    return self.text.step(self.embed(input_ids_BxL), positions_3xBxL, key_valid_BxT, cache, start)

  def image_tokens(self, pixel_values_XxF, grid_thw) -> jax.Array:
    """Codebook ids of condition images, image after image, each in raster order.

    `pixel_values_XxF`: the processor's packed patch rows (channels x patch x patch each) of all
    images; `grid_thw`: host-side (num_images, 3) patch grids with t = 1. Each image gets its own
    attention; the encoder is compiled once per distinct (h, w).
    """
    v = self.cfg.vision
    grid = np.asarray(grid_thw)
    if grid.ndim != 2 or grid.shape[1] != 3 or not np.issubdtype(grid.dtype, np.integer):
      raise ValueError(f"grid_thw must be an integer (num_images, 3) array, got {grid.dtype} {grid.shape}")
    if len(grid) == 0 or (grid <= 0).any():
      raise ValueError(f"grid_thw must hold at least one image with positive sizes, got {grid.tolist()}")
    if (grid[:, 0] != 1).any():
      raise ValueError(f"grid_thw temporal sizes must be 1 (images), got {grid[:, 0].tolist()}")
    if pixel_values_XxF.ndim != 2 or pixel_values_XxF.shape[1] != v.patch_dim:
      raise ValueError(f"pixel_values must be [N, {v.patch_dim}] (channels x patch x patch), "
                       f"got shape {tuple(pixel_values_XxF.shape)}")
    sizes = grid[:, 1] * grid[:, 2]
    if int(sizes.sum()) != pixel_values_XxF.shape[0]:
      raise ValueError(f"grid_thw {grid.tolist()} covers {int(sizes.sum())} patches but pixel_values has "
                       f"{pixel_values_XxF.shape[0]}")
    ids, offset = [], 0
    for (_, h, w), n in zip(grid.tolist(), sizes.tolist()):
      patches = jnp.asarray(pixel_values_XxF[offset:offset + n], self.cfg.dtype)
      ids.append(_image_ids(self, patches, h, w))
      offset += n
    return jnp.concatenate(ids)


def merge_image_tokens(input_ids_BxL, image_ids_X, image_token_id: int) -> np.ndarray:
  """Host-side: replaces the `image_token_id` placeholders, in row-major order, by `image_ids_X`."""
  ids = np.array(input_ids_BxL)
  image_ids = np.asarray(image_ids_X).reshape(-1)
  slots = ids == image_token_id
  if int(slots.sum()) != image_ids.size:
    raise ValueError(f"{int(slots.sum())} image placeholder tokens (id {image_token_id}) but "
                     f"{image_ids.size} image token ids")
  ids[slots] = image_ids
  return ids
