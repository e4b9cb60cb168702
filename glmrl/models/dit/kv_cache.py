"""Functional key/value cache of the source images that condition image-to-image generation.

The reference (`GlmImageKVCache`) is mutable per-layer state. Here it is a pytree that the
model takes and returns, so it works under jit:

- write: a forward pass over source-image latents returns a cache with one slot per batch
  row holding every layer's keys (normalised and rotated) and values of that pass;
  `append_images` concatenates a further source image onto each slot, `stack_slots` puts
  the slots of separate passes (samples) side by side, padding shorter slots.
- read: every layer attends over [slot keys, own keys]; slot i serves batch rows
  i*r ... (i+1)*r-1 with r = batch / slots (one slot serves the whole batch).
- skip: the cache is ignored (the unconditional branch of classifier-free guidance).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

CACHE_MODES = ("write", "read", "skip")


class DiTKVCache(NamedTuple):
  """k, v: [layers, slots, S, heads, head_dim]; valid: [slots, S] bool (False = padding)."""
  k: jax.Array
  v: jax.Array
  valid: jax.Array

  @property
  def num_slots(self) -> int:
    return self.k.shape[1]

  @property
  def length(self) -> int:
    return self.k.shape[2]


def _check_same_layout(a: DiTKVCache, b: DiTKVCache, what: str) -> None:
  la, lb = a.k.shape, b.k.shape
  if (la[0], la[3], la[4]) != (lb[0], lb[3], lb[4]):
    raise ValueError(f"{what}: caches differ in layers/heads/head_dim: {la} vs {lb}")


def append_images(cache: DiTKVCache, new: DiTKVCache) -> DiTKVCache:
  """Appends `new`'s tokens to each slot (another source image of the same samples)."""
  _check_same_layout(cache, new, "append_images")
  if cache.num_slots != new.num_slots:
    raise ValueError(f"append_images: {cache.num_slots} slots vs {new.num_slots} slots in the new cache")
  return DiTKVCache(
      k=jnp.concatenate([cache.k, new.k.astype(cache.k.dtype)], axis=2),
      v=jnp.concatenate([cache.v, new.v.astype(cache.v.dtype)], axis=2),
      valid=jnp.concatenate([cache.valid, new.valid], axis=1))


def stack_slots(caches: Sequence[DiTKVCache]) -> DiTKVCache:
  """Concatenates slots of several caches; shorter ones are padded at the end with valid=False."""
  if not caches:
    raise ValueError("stack_slots needs at least one cache")
  for c in caches[1:]:
    _check_same_layout(caches[0], c, "stack_slots")
  length = max(c.length for c in caches)

  def pad(c: DiTKVCache) -> DiTKVCache:
    extra = length - c.length
    kv_pad = ((0, 0), (0, 0), (0, extra), (0, 0), (0, 0))
    return DiTKVCache(jnp.pad(c.k, kv_pad), jnp.pad(c.v, kv_pad),
                      jnp.pad(c.valid, ((0, 0), (0, extra)), constant_values=False))

  padded = [pad(c) for c in caches]
  return DiTKVCache(
      k=jnp.concatenate([c.k for c in padded], axis=1),
      v=jnp.concatenate([c.v for c in padded], axis=1),
      valid=jnp.concatenate([c.valid for c in padded], axis=0))


def check_cache(cache: DiTKVCache, num_layers: int, heads: int, head_dim: int, batch: int) -> None:
  """ValueError unless `cache` fits the model and can serve `batch` rows."""
  if not isinstance(cache, DiTKVCache):
    raise ValueError(f"kv_cache must be a DiTKVCache, got {type(cache).__name__}")
  if cache.k.ndim != 5 or cache.k.shape != cache.v.shape:
    raise ValueError(f"kv_cache k {cache.k.shape} / v {cache.v.shape} must both be [layers, slots, S, heads, head_dim]")
  if cache.valid.shape != cache.k.shape[1:3]:
    raise ValueError(f"kv_cache valid {cache.valid.shape} must be [slots, S] = {cache.k.shape[1:3]}")
  layers, slots, _, h, d = cache.k.shape
  if (layers, h, d) != (num_layers, heads, head_dim):
    raise ValueError(f"kv_cache has layers/heads/head_dim {(layers, h, d)}, the model {(num_layers, heads, head_dim)}")
  if batch % slots:
    raise ValueError(f"cannot serve batch {batch} from {slots} cache slots: batch must be a multiple of the slots")


def layer_slots_for_batch(cache: DiTKVCache, layer: int, batch: int) -> tuple[jax.Array, jax.Array]:
  """One layer's k, v as [batch, S, heads, head_dim]: slot i serves rows i*r ... (i+1)*r-1."""
  r = batch // cache.num_slots
  k, v = cache.k[layer], cache.v[layer]
  if r == 1:
    return k, v
  return jnp.repeat(k, r, axis=0), jnp.repeat(v, r, axis=0)


def valid_for_batch(cache: DiTKVCache, batch: int) -> jax.Array:
  """valid as [batch, S], slots repeated like `layer_slots_for_batch`."""
  return jnp.repeat(cache.valid, batch // cache.num_slots, axis=0)
