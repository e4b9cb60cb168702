"""Vector quantizer: vision features -> ids of the nearest L2-normalised codebook entry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.ar.config import ARConfig
from glmrl.sharding import CONV_IN, CONV_OUT


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """x / max(||x||, eps) over the last axis (torch's F.normalize)."""
  norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True))
  return x / jnp.maximum(norm, eps)


def _conv1x1(cfg: ARConfig, d_in: int, d_out: int, *, rngs: nnx.Rngs) -> nnx.Conv:
  return nnx.Conv(d_in, d_out, (1, 1), dtype=jnp.float32, param_dtype=cfg.param_dtype, rngs=rngs,
                  precision=jax.lax.Precision.HIGHEST,
                  kernel_metadata={"out_sharding": (None, None, CONV_IN, CONV_OUT)},
                  bias_metadata={"out_sharding": (CONV_OUT,)})


class VectorQuantizer(nnx.Module):
  """quant_conv (1x1) then cosine-nearest codebook entry.

  Always float32 at full matmul precision whatever the model dtype: the ids are discrete,
  so rounding would flip near-ties.

  `post_quant_conv` is part of the checkpoint (the reference VQ-VAE holds it for its
  decoder); nothing here reads it, it is kept so conversion covers every tensor.
  """

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    q = cfg.vq
    self.quant_conv = _conv1x1(cfg, q.latent_channels, q.embed_dim, rngs=rngs)
    self.post_quant_conv = _conv1x1(cfg, q.embed_dim, q.latent_channels, rngs=rngs)
    self.codebook = nnx.Embed(q.num_embeddings, q.embed_dim, dtype=jnp.float32, param_dtype=cfg.param_dtype,
                              rngs=rngs, embedding_metadata={"out_sharding": (None, None)})

  def __call__(self, feats_XxC: jax.Array) -> jax.Array:
    """Codebook ids [N] (int32) of per-token features [N, latent_channels]."""
    z_XxE = self.quant_conv(feats_XxC.astype(jnp.float32)[None, :, None, :])[0, :, 0, :]
    z_XxE = l2_normalize(z_XxE)
    e_VxE = l2_normalize(self.codebook.embedding[...].astype(jnp.float32))
    # Same expansion of |z - e|^2 as the reference so near-ties resolve the same way.
    dist_XxV = (jnp.sum(jnp.square(z_XxE), axis=1, keepdims=True) + jnp.sum(jnp.square(e_VxE), axis=1)[None]
                - 2 * jnp.einsum("ne,ce->nc", z_XxE, e_VxE, precision=jax.lax.Precision.HIGHEST))
    return jnp.argmin(dist_XxV, axis=1).astype(jnp.int32)
