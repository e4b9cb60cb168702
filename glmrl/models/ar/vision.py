"""The ViT that encodes one condition image (packed patches) into per-patch features."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.models.ar.config import ACTIVATIONS, ARConfig
from glmrl.models.ar.text import StackedLinear, linear
from glmrl.sharding import CONV_IN, CONV_OUT, EMBED, HEADS, MLP

# Queries per attention chunk: bounds the [heads, chunk, N] logits of large images.
_QUERY_CHUNK = 1024


def pos_embed_taps(h: int, w: int, grid: int) -> tuple[np.ndarray, np.ndarray]:
  """Bilinear taps that resample the grid x grid position table to an h x w patch grid.

  Patch (i, j) samples the table at the centre of its cell, like `grid_sample(bilinear,
  align_corners=False, padding_mode="border")` on normalised coordinates ((j + .5) / w) * 2 - 1.
  Returns table rows [h*w, 4] (int32) and weights [h*w, 4] (float32) in raster order.
  Computed on the host in float32 with the reference's operation order.
  """
  f32 = np.float32
  hc = np.repeat(np.arange(h), w).astype(f32)
  wc = np.tile(np.arange(w), h).astype(f32)
  norm_x = ((wc + f32(0.5)) / f32(w)) * f32(2) - f32(1)
  norm_y = ((hc + f32(0.5)) / f32(h)) * f32(2) - f32(1)
  x = np.clip(((norm_x + f32(1)) * f32(grid) - f32(1)) / f32(2), f32(0), f32(grid - 1))
  y = np.clip(((norm_y + f32(1)) * f32(grid) - f32(1)) / f32(2), f32(0), f32(grid - 1))
  x0, y0 = np.floor(x), np.floor(y)
  x1, y1 = x0 + f32(1), y0 + f32(1)
  wts = np.stack([(x1 - x) * (y1 - y), (x - x0) * (y1 - y), (x1 - x) * (y - y0), (x - x0) * (y - y0)], -1)
  # A corner past the border has weight exactly 0 after clipping; clamp its index to stay in range.
  xi0, yi0 = x0.astype(np.int32), y0.astype(np.int32)
  xi1, yi1 = np.minimum(xi0 + 1, grid - 1), np.minimum(yi0 + 1, grid - 1)
  rows = np.stack([yi0 * grid + xi0, yi0 * grid + xi1, yi1 * grid + xi0, yi1 * grid + xi1], -1)
  return rows.astype(np.int32), wts.astype(f32)


def full_attention(q_XxHxD: jax.Array, k_XxHxD: jax.Array, v_XxHxD: jax.Array) -> jax.Array:
  """Bidirectional attention within one image, in query chunks; softmax in float32."""
  n, h, d = q_XxHxD.shape

  def attend(q_LxHxD):
    logits_HxLxX = jnp.einsum("chd,nhd->hcn", q_LxHxD, k_XxHxD, preferred_element_type=jnp.float32) * (d ** -0.5)
    probs_HxLxX = jax.nn.softmax(logits_HxLxX, axis=-1).astype(v_XxHxD.dtype)
    return jnp.einsum("hcn,nhd->chd", probs_HxLxX, v_XxHxD)

  if n <= _QUERY_CHUNK:
    return attend(q_XxHxD)
  chunks = -(-n // _QUERY_CHUNK)
  q_pad = jnp.pad(q_XxHxD, ((0, chunks * _QUERY_CHUNK - n), (0, 0), (0, 0)))
  out = jax.lax.map(attend, q_pad.reshape(chunks, _QUERY_CHUNK, h, d))
  return out.reshape(chunks * _QUERY_CHUNK, h, d)[:n]


class VisionAttention(nnx.Module):

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.num_heads, self.head_dim = v.num_heads, v.head_dim
    self.qkv = StackedLinear(cfg, v.hidden_size, 3, v.hidden_size, (EMBED, HEADS), use_bias=v.attention_bias,
                             rngs=rngs)
    self.proj = linear(cfg, v.hidden_size, v.hidden_size, (HEADS, EMBED), use_bias=v.attention_bias, rngs=rngs)

  def __call__(self, x_XxE):
    n = x_XxE.shape[0]
    qkv_Xx3xE = self.qkv(x_XxE)
    q, k, v = (qkv_Xx3xE[:, i].reshape(n, self.num_heads, self.head_dim) for i in range(3))
    return self.proj(full_attention(q, k, v).reshape(n, -1))


class VisionMLP(nnx.Module):

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.fc1 = linear(cfg, v.hidden_size, v.intermediate_size, (EMBED, MLP), use_bias=True, rngs=rngs)
    self.fc2 = linear(cfg, v.intermediate_size, v.hidden_size, (MLP, EMBED), use_bias=True, rngs=rngs)
    self.act = ACTIVATIONS[v.hidden_act]

  def __call__(self, x_XxE):
    return self.fc2(self.act(self.fc1(x_XxE)))


def _layer_norm(cfg: ARConfig, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
  # Two-pass variance, as torch's LayerNorm.
  return nnx.LayerNorm(cfg.vision.hidden_size, epsilon=cfg.vision.layer_norm_eps, use_fast_variance=False,
                       dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                       scale_metadata={"out_sharding": (EMBED,)}, bias_metadata={"out_sharding": (EMBED,)})


class VisionBlock(nnx.Module):

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    self.norm1 = _layer_norm(cfg, rngs=rngs)
    self.attn = VisionAttention(cfg, rngs=rngs)
    self.norm2 = _layer_norm(cfg, rngs=rngs)
    self.mlp = VisionMLP(cfg, rngs=rngs)

  def __call__(self, x_XxE):
    x_XxE = x_XxE + self.attn(self.norm1(x_XxE))
    return x_XxE + self.mlp(self.norm2(x_XxE))


class VisionEncoder(nnx.Module):
  """Patch embedding + resampled learned positions + pre-norm ViT blocks (no final norm)."""

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.cfg = cfg
    p = v.patch_size
    self.patch_embed = nnx.Conv(v.in_channels, v.hidden_size, (p, p), strides=(p, p), padding="VALID",
                                dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                                kernel_metadata={"out_sharding": (None, None, CONV_IN, CONV_OUT)},
                                bias_metadata={"out_sharding": (CONV_OUT,)})
    self.pos_embed = nnx.Embed(v.pos_grid ** 2, v.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                               rngs=rngs, embedding_metadata={"out_sharding": (None, EMBED)})
    self.blocks = nnx.List([VisionBlock(cfg, rngs=rngs) for _ in range(v.depth)])

  def __call__(self, patches_XxF: jax.Array, h: int, w: int) -> jax.Array:
    """Features [h*w, hidden] of one image given its h*w packed patch rows (raster order)."""
    v = self.cfg.vision
    n = patches_XxF.shape[0]
    if patches_XxF.ndim != 2 or patches_XxF.shape[1] != v.patch_dim or n != h * w:
      raise ValueError(f"patches shape {patches_XxF.shape} does not match an {h}x{w} grid of "
                       f"{v.patch_dim}-wide patch rows")
    p = v.patch_size
    pixels_XxpxpxC = patches_XxF.reshape(n, v.in_channels, p, p).transpose(0, 2, 3, 1)
    x_XxE = self.patch_embed(pixels_XxpxpxC).reshape(n, v.hidden_size)
    rows_Xx4, wts_Xx4 = pos_embed_taps(h, w, v.pos_grid)
    # The reference resamples the table in float32 and casts the result to the table's dtype.
    table = self.pos_embed.embedding[...].astype(jnp.float32)
    pos_XxE = jnp.einsum("nk,nke->ne", jnp.asarray(wts_Xx4), table[jnp.asarray(rows_Xx4)])
    x_XxE = x_XxE + pos_XxE.astype(self.pos_embed.embedding.dtype).astype(x_XxE.dtype)
    for block in self.blocks:
      x_XxE = block(x_XxE)
    return x_XxE
