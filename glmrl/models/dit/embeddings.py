"""Timestep / size conditioning and (un)patchifying of NCHW latents."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.dit.config import DiTConfig
from glmrl.models.dit.layers import linear
from glmrl.sharding import EMBED


def sinusoidal_embedding(x_B: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
  """[N] -> [N, dim] float32 features ordered (cos, sin), frequencies exp(-log(P) i / (dim/2))."""
  half = dim // 2
  # Same operation order as the reference so float32 frequencies agree to the ulp.
  exponent = (-math.log(max_period) * jnp.arange(half, dtype=jnp.float32)) / half
  args_BxF = x_B.astype(jnp.float32)[:, None] * jnp.exp(exponent)[None, :]
  emb = jnp.concatenate([jnp.cos(args_BxF), jnp.sin(args_BxF)], axis=-1)
  if dim % 2:
    emb = jnp.pad(emb, ((0, 0), (0, 1)))
  return emb


class TimeConditionEmbed(nnx.Module):
  """silu(MLP(sin(timestep)) + MLP(sin(crop_coords), sin(target_size))): the AdaLN conditioning."""

  def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    t = cfg.time_embed_dim
    self.time_fc1 = linear(cfg, t, t, (None, None), rngs=rngs)
    self.time_fc2 = linear(cfg, t, t, (None, None), rngs=rngs)
    self.cond_fc1 = linear(cfg, cfg.pooled_condition_dim, t, (None, None), rngs=rngs)
    self.cond_fc2 = linear(cfg, t, t, (None, None), rngs=rngs)

  def __call__(self, timestep_B: jax.Array, target_size_Bx2: jax.Array, crop_coords_Bx2: jax.Array) -> jax.Array:
    cfg = self.cfg
    batch = timestep_B.shape[0]
    t_emb = sinusoidal_embedding(timestep_B, cfg.time_embed_dim).astype(cfg.dtype)
    crop = sinusoidal_embedding(crop_coords_Bx2.reshape(-1), cfg.condition_dim).reshape(batch, -1)
    size = sinusoidal_embedding(target_size_Bx2.reshape(-1), cfg.condition_dim).reshape(batch, -1)
    cond = jnp.concatenate([crop, size], axis=-1).astype(cfg.dtype)
    t_emb = self.time_fc2(jax.nn.silu(self.time_fc1(t_emb)))
    c_emb = self.cond_fc2(jax.nn.silu(self.cond_fc1(cond)))
    return jax.nn.silu(t_emb + c_emb)


def patchify(latents_BxCxhxw: jax.Array, p: int) -> jax.Array:
  """NCHW -> [B, (H/p)(W/p), C p p] tokens, row-major over patches, (C, ph, pw) within one."""
  b, c, h, w = latents_BxCxhxw.shape
  x = latents_BxCxhxw.reshape(b, c, h // p, p, w // p, p)
  x = jnp.transpose(x, (0, 2, 4, 1, 3, 5))
  return x.reshape(b, (h // p) * (w // p), c * p * p)


def unpatchify(tokens_BxXxF: jax.Array, hp: int, wp: int, p: int) -> jax.Array:
  """Inverse of `patchify`: [B, hp wp, C p p] -> NCHW [B, C, hp p, wp p]."""
  b = tokens_BxXxF.shape[0]
  x = tokens_BxXxF.reshape(b, hp, wp, -1, p, p)
  x = jnp.transpose(x, (0, 3, 1, 4, 2, 5))
  return x.reshape(b, x.shape[1], hp * p, wp * p)


def image_projector(cfg: DiTConfig, *, rngs: nnx.Rngs) -> nnx.Linear:
  return linear(cfg, cfg.in_channels * cfg.patch_size**2, cfg.inner_dim, (None, EMBED), rngs=rngs)
