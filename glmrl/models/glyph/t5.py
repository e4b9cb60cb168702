"""T5 encoder stack (transformers `T5EncoderModel`) in Flax NNX: the ByT5 glyph encoder.

Pre-norm blocks with RMS layer norms (no mean, no bias), unscaled dot-product attention plus a
bucketed relative-position bias learned by the first layer and shared by all, and a (gated)
feed-forward. Mixed precision follows the reference: sub-layers run in `cfg.dtype`, while `wo`
(transformers keeps it in float32) and the residual stream stay float32.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.models.glyph.config import T5EncoderConfig
from glmrl.sharding import EMBED, HEADS, KV, MLP, VOCAB

_ACTS = {
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
}


@functools.lru_cache(maxsize=64)
def relative_position_buckets(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
  """[length, length] int32 bucket of (key position - query position), bidirectional.

  Host-side numpy in float32 so the log-spaced bucket edges round exactly as in the
  reference on every backend (several edges fall on exact powers of two).
  """
  rel = np.arange(length, dtype=np.int64)[None, :] - np.arange(length, dtype=np.int64)[:, None]
  half = num_buckets // 2
  bucket = (rel > 0).astype(np.int64) * half
  dist = np.abs(rel)
  max_exact = half // 2
  scaled = (np.log(np.maximum(dist, 1).astype(np.float32) / max_exact)
            / math.log(max_distance / max_exact) * (half - max_exact))
  large = np.minimum(max_exact + scaled.astype(np.int64), half - 1)
  bucket += np.where(dist < max_exact, dist, large)
  return bucket.astype(np.int32)


class RMSNorm(nnx.Module):
  def __init__(self, cfg: T5EncoderConfig, *, rngs: nnx.Rngs):
    del rngs
    self.eps = cfg.layer_norm_epsilon
    self.dtype = cfg.dtype
    self.scale = nnx.Param(jnp.ones((cfg.d_model,), cfg.param_dtype), out_sharding=(EMBED,))

  def __call__(self, x_BxLxD):
    x = x_BxLxD.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(self.dtype) * x.astype(self.dtype)


def _linear(cfg: T5EncoderConfig, d_in: int, d_out: int, sharding, *, rngs, dtype=None):
  return nnx.Linear(d_in, d_out, use_bias=False, dtype=cfg.dtype if dtype is None else dtype,
                    param_dtype=cfg.param_dtype, rngs=rngs,
                    kernel_metadata={"out_sharding": sharding})


class SelfAttention(nnx.Module):
  def __init__(self, cfg: T5EncoderConfig, *, rngs: nnx.Rngs):
    self.num_heads, self.head_dim = cfg.num_heads, cfg.d_kv
    inner = cfg.num_heads * cfg.d_kv
    self.q = _linear(cfg, cfg.d_model, inner, (EMBED, HEADS), rngs=rngs)
    self.k = _linear(cfg, cfg.d_model, inner, (EMBED, KV), rngs=rngs)
    self.v = _linear(cfg, cfg.d_model, inner, (EMBED, KV), rngs=rngs)
    self.o = _linear(cfg, inner, cfg.d_model, (HEADS, EMBED), rngs=rngs)

  def __call__(self, x_BxLxD, bias_1xHxLxS, mask_Bx1x1xS):
    b, l, _ = x_BxLxD.shape
    h, d = self.num_heads, self.head_dim
    q_BxLxHxD = self.q(x_BxLxD).reshape(b, l, h, d)
    k_BxSxHxD = self.k(x_BxLxD).reshape(b, l, h, d)
    v_BxSxHxD = self.v(x_BxLxD).reshape(b, l, h, d)
    # T5 does not scale q.k: the 1/sqrt(d) is folded into the initialisation.
    logits_BxHxLxS = jnp.einsum("blhd,bshd->bhls", q_BxLxHxD, k_BxSxHxD,
                                preferred_element_type=jnp.float32)
    logits_BxHxLxS = logits_BxHxLxS + bias_1xHxLxS.astype(jnp.float32)
    logits_BxHxLxS = jnp.where(mask_Bx1x1xS, logits_BxHxLxS, jnp.finfo(jnp.float32).min)
    probs_BxHxLxS = jax.nn.softmax(logits_BxHxLxS, axis=-1).astype(v_BxSxHxD.dtype)
    o_BxLxHxD = jnp.einsum("bhls,bshd->blhd", probs_BxHxLxS, v_BxSxHxD)
    return self.o(o_BxLxHxD.reshape(b, l, h * d))


class FeedForward(nnx.Module):
  def __init__(self, cfg: T5EncoderConfig, *, rngs: nnx.Rngs):
    self.act = _ACTS[cfg.activation]
    if cfg.is_gated:
      self.wi_0 = _linear(cfg, cfg.d_model, cfg.d_ff, (EMBED, MLP), rngs=rngs)
      self.wi_1 = _linear(cfg, cfg.d_model, cfg.d_ff, (EMBED, MLP), rngs=rngs)
      self.wi = None
    else:
      self.wi = _linear(cfg, cfg.d_model, cfg.d_ff, (EMBED, MLP), rngs=rngs)
    self.wo = _linear(cfg, cfg.d_ff, cfg.d_model, (MLP, EMBED), rngs=rngs, dtype=jnp.float32)

  def __call__(self, x_BxLxD):
    if self.wi is None:
      h_BxLxF = self.act(self.wi_0(x_BxLxD)) * self.wi_1(x_BxLxD)
    else:
      h_BxLxF = self.act(self.wi(x_BxLxD))
    return self.wo(h_BxLxF.astype(jnp.float32))


class EncoderLayer(nnx.Module):
  def __init__(self, cfg: T5EncoderConfig, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg, rngs=rngs)
    self.attn = SelfAttention(cfg, rngs=rngs)
    self.ff_norm = RMSNorm(cfg, rngs=rngs)
    self.ff = FeedForward(cfg, rngs=rngs)

  def __call__(self, x_BxLxD, bias_1xHxLxS, mask_Bx1x1xS):
    x_BxLxD = x_BxLxD + self.attn(self.attn_norm(x_BxLxD), bias_1xHxLxS, mask_Bx1x1xS)
    return x_BxLxD + self.ff(self.ff_norm(x_BxLxD))


class T5Encoder(nnx.Module):
  """`__call__(input_ids [B, L] int, attention_mask [B, L] 0/1) -> last_hidden_state [B, L, d_model]`."""

  def __init__(self, cfg: T5EncoderConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                           embedding_init=nnx.initializers.normal(1.0), rngs=rngs,
                           embedding_metadata={"out_sharding": (VOCAB, EMBED)})
    self.relative_attention_bias = nnx.Param(
        nnx.initializers.normal(cfg.d_model ** -0.5)(
            rngs.params(), (cfg.relative_attention_num_buckets, cfg.num_heads), cfg.param_dtype),
        out_sharding=(None, None))
    self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg, rngs=rngs)

  def position_bias(self, length: int):
    """[1, H, L, L] relative-position bias (static length)."""
    buckets_LxL = relative_position_buckets(length, self.cfg.relative_attention_num_buckets,
                                            self.cfg.relative_attention_max_distance)
    bias_LxLxH = jnp.take(self.relative_attention_bias[...], jnp.asarray(buckets_LxL), axis=0)
    return jnp.transpose(bias_LxLxH, (2, 0, 1))[None]

  def __call__(self, input_ids_BxL, attention_mask_BxL=None):
    if input_ids_BxL.ndim != 2:
      raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids_BxL.shape)}")
    if attention_mask_BxL is None:
      attention_mask_BxL = jnp.ones(input_ids_BxL.shape, jnp.bool_)
    elif attention_mask_BxL.shape != input_ids_BxL.shape:
      raise ValueError(f"attention_mask shape {tuple(attention_mask_BxL.shape)} != input_ids shape "
                       f"{tuple(input_ids_BxL.shape)}")
    mask_Bx1x1xS = (attention_mask_BxL != 0)[:, None, None, :]
    bias_1xHxLxS = self.position_bias(input_ids_BxL.shape[1])
    x_BxLxD = self.embed(input_ids_BxL).astype(jnp.float32)
    for layer in self.layers:
      x_BxLxD = layer(x_BxLxD, bias_1xHxLxS, mask_Bx1x1xS)
    return self.final_norm(x_BxLxD)
