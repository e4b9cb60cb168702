"""2D rotary position embedding of the image tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rope_tables(height: int, width: int, head_dim: int, theta: float = 10000.0) -> tuple[jax.Array, jax.Array]:
  """cos, sin [height*width, head_dim] for a row-major grid of patches.

  Per head the first quarter of frequencies encodes the row, the second the column;
  the half is repeated so that `apply_rope` rotates dimension i with i + head_dim/2.
  """
  quarter = head_dim // 4
  half = head_dim // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, half, 2, dtype=jnp.float32)[:quarter] / half))
  rows_hxF = jnp.arange(height, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  cols_wxF = jnp.arange(width, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  freqs_hxwxHalf = jnp.concatenate([
      jnp.broadcast_to(rows_hxF[:, None, :], (height, width, quarter)),
      jnp.broadcast_to(cols_wxF[None, :, :], (height, width, quarter)),
  ], axis=-1)
  freqs_XxD = jnp.concatenate([freqs_hxwxHalf, freqs_hxwxHalf], axis=-1).reshape(height * width, head_dim)
  return jnp.cos(freqs_XxD), jnp.sin(freqs_XxD)


def with_unrotated_prefix(cos_XxD: jax.Array, sin_XxD: jax.Array, prefix: int) -> tuple[jax.Array, jax.Array]:
  """Prepends `prefix` identity rotations (cos 1, sin 0): text tokens carry no position."""
  d = cos_XxD.shape[-1]
  ones = jnp.ones((prefix, d), cos_XxD.dtype)
  zeros = jnp.zeros((prefix, d), sin_XxD.dtype)
  return jnp.concatenate([ones, cos_XxD], axis=0), jnp.concatenate([zeros, sin_XxD], axis=0)


def apply_rope(x_BxSxHxD: jax.Array, cos_SxD: jax.Array, sin_SxD: jax.Array) -> jax.Array:
  """Rotates (x_i, x_{i+D/2}) pairs; computed in float32, returned in x's dtype."""
  x1, x2 = jnp.split(x_BxSxHxD, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  cos = cos_SxD[None, :, None, :]
  sin = sin_SxD[None, :, None, :]
  out = x_BxSxHxD.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin
  return out.astype(x_BxSxHxD.dtype)
