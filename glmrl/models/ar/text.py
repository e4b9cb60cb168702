"""The GLM-4 text decoder of the AR generator: GQA attention with M-RoPE, sandwich RMSNorms, KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct

from glmrl.models.ar.config import ACTIVATIONS, ARConfig
from glmrl.sharding import EMBED, HEADS, KV, MLP, VOCAB, constrain_batch

_MASKED = float(jnp.finfo(jnp.float32).min)


def linear(cfg: ARConfig, d_in: int, d_out: int, sharding: tuple, *, use_bias: bool,
           rngs: nnx.Rngs) -> nnx.Linear:
  """nnx.Linear whose kernel [in, out] carries `sharding` and bias its output name."""
  return nnx.Linear(d_in, d_out, use_bias=use_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                    kernel_metadata={"out_sharding": tuple(sharding)},
                    bias_metadata={"out_sharding": (sharding[1],)})


class StackedLinear(nnx.Module):
  """`n` linear maps of the same input stored as kernel [in, n, out] (fused q/k/v, gate/up).

  Keeping the `n` axis separate lets the `out` axis be sharded without splitting the
  members unevenly across devices (a flat [in, n*out] kernel would put gate and up on
  different shards).
  """

  def __init__(self, cfg: ARConfig, d_in: int, n: int, d_out: int, names: tuple, *, use_bias: bool,
               rngs: nnx.Rngs):
    init = nnx.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))
    self.kernel = nnx.Param(init(rngs.params(), (d_in, n, d_out), cfg.param_dtype),
                            out_sharding=(names[0], None, names[1]))
    self.bias = (nnx.Param(jnp.zeros((n, d_out), cfg.param_dtype), out_sharding=(None, names[1]))
                 if use_bias else None)
    self.dtype = cfg.dtype

  def __call__(self, x_BxLxI: jax.Array) -> jax.Array:
    kernel_IxJxO = self.kernel[...].astype(self.dtype)
    y_BxLxJxO = jnp.einsum("...i,iso->...so", x_BxLxI.astype(self.dtype), kernel_IxJxO)
    if self.bias is not None:
      y_BxLxJxO = y_BxLxJxO + self.bias[...].astype(self.dtype)
    return y_BxLxJxO


class RMSNorm(nnx.Module):
  """x / rms(x) * scale, normalised in float32 and cast back before the scale (as the reference)."""

  def __init__(self, cfg: ARConfig, dim: int, eps: float, *, rngs: nnx.Rngs):
    del rngs
    self.scale = nnx.Param(jnp.ones((dim,), cfg.param_dtype), out_sharding=(EMBED,))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


@struct.dataclass
class KVCache:
  """Rotated keys and values, one [B, K, T, D] array per decoder layer (kv heads ahead of the slots), so that a
  decode step's attention products are plain matmuls batched over (B, K) (`cached_gqa_attention`)."""
  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @property
  def batch(self) -> int:
    return self.k[0].shape[0]

  @property
  def max_len(self) -> int:
    return self.k[0].shape[2]


def mrope_cos_sin(cfg: ARConfig, positions_3xBxL: jax.Array) -> tuple[jax.Array, jax.Array]:
  """cos, sin [B, L, rotary_dim] of the 3D rotary embedding.

  Frequency f of the rotated half takes its position from row (section of f) % 3 of
  `positions_3xBxL` (temporal, height, width); the table is repeated for the two halves
  that `rotate_half` pairs up.
  """
  t = cfg.text
  r = t.rotary_dim
  inv_freq_F = 1.0 / (np.float32(t.rope_theta) ** (np.arange(0, r, 2, dtype=np.float32) / np.float32(r)))
  rows_F = np.concatenate([np.full(s, i % 3) for i, s in enumerate(t.mrope_section)])
  pos_FxBxL = jnp.take(positions_3xBxL, jnp.asarray(rows_F), axis=0).astype(jnp.float32)
  freqs_BxLxF = jnp.moveaxis(pos_FxBxL, 0, -1) * jnp.asarray(inv_freq_F, jnp.float32)
  freqs_BxLxA = jnp.concatenate([freqs_BxLxF, freqs_BxLxF], axis=-1)
  return jnp.cos(freqs_BxLxA).astype(cfg.dtype), jnp.sin(freqs_BxLxA).astype(cfg.dtype)


def apply_rope(x_BxLxHxD: jax.Array, cos_BxLxA: jax.Array, sin_BxLxA: jax.Array) -> jax.Array:
  """Rotates the first rotary_dim channels of each head; the rest pass through."""
  r = cos_BxLxA.shape[-1]
  x_rot, x_pass = x_BxLxHxD[..., :r], x_BxLxHxD[..., r:]
  half = r // 2
  rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
  cos, sin = cos_BxLxA[:, :, None, :], sin_BxLxA[:, :, None, :]
  return jnp.concatenate([x_rot * cos + rotated * sin, x_pass], axis=-1)


def gqa_attention(q_BxLxHxD: jax.Array, k_BxTxKxD: jax.Array, v_BxTxKxD: jax.Array,
                  mask_BxLxT: jax.Array) -> jax.Array:
  """Grouped-query attention; query head h reads kv head h // (H // K). Softmax in float32.

  Fully masked rows (left padding) get a uniform distribution instead of NaN.
  """
  b, l, h, d = q_BxLxHxD.shape
  k = k_BxTxKxD.shape[2]
  q_BxLxKxQxD = q_BxLxHxD.reshape(b, l, k, h // k, d)
  logits_BxKxQxLxT = jnp.einsum("blkgd,btkd->bkglt", q_BxLxKxQxD, k_BxTxKxD,
                                preferred_element_type=jnp.float32) * (d ** -0.5)
  probs_BxKxQxLxT = _masked_softmax(logits_BxKxQxLxT, mask_BxLxT).astype(v_BxTxKxD.dtype)
  out_BxLxKxQxD = jnp.einsum("bkglt,btkd->blkgd", probs_BxKxQxLxT, v_BxTxKxD)
  return out_BxLxKxQxD.reshape(b, l, h * d)


def cached_gqa_attention(q_BxLxHxD: jax.Array, k_BxKxTxD: jax.Array, v_BxKxTxD: jax.Array,
                         mask_BxLxT: jax.Array) -> jax.Array:
  """`gqa_attention` over a heads-major cache: both products are matmuls batched over (B, K) with the cache the
  right-hand operand as it lies. (Over a [B, T, K, D] cache XLA:CPU computed the value product with the cache on
  the left, contracting its slots: 1.5 ms per layer and token at batch 8 and 352 slots, a quarter of a decode
  step, `docs/benchmarks.md`.)"""
  b, l, h, d = q_BxLxHxD.shape
  k = k_BxKxTxD.shape[1]
  q_BxKxQLxD = jnp.transpose(q_BxLxHxD.reshape(b, l, k, h // k, d), (0, 2, 3, 1, 4)).reshape(b, k, -1, d)
  batch = ((0, 1), (0, 1))
  logits_BxKxQLxT = jax.lax.dot_general(q_BxKxQLxD, k_BxKxTxD, (((3,), (3,)), batch),
                                        preferred_element_type=jnp.float32) * (d ** -0.5)
  probs_BxKxQxLxT = _masked_softmax(logits_BxKxQLxT.reshape(b, k, h // k, l, -1), mask_BxLxT)
  probs_BxKxQLxT = probs_BxKxQxLxT.astype(v_BxKxTxD.dtype).reshape(b, k, h // k * l, -1)
  out_BxKxQLxD = jax.lax.dot_general(probs_BxKxQLxT, v_BxKxTxD, (((3,), (2,)), batch))
  out_BxLxKxQxD = jnp.transpose(out_BxKxQLxD.reshape(b, k, h // k, l, d), (0, 3, 1, 2, 4))
  return out_BxLxKxQxD.reshape(b, l, h * d)


def _masked_softmax(logits_BxKxQxLxT, mask_BxLxT):
  return jax.nn.softmax(jnp.where(mask_BxLxT[:, None, None], logits_BxKxQxLxT, _MASKED), axis=-1)


class Attention(nnx.Module):

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    t = cfg.text
    self.num_heads, self.num_kv_heads, self.head_dim = t.num_attention_heads, t.num_key_value_heads, t.head_dim
    q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    self.q = linear(cfg, t.hidden_size, q_dim, (EMBED, HEADS), use_bias=t.attention_bias, rngs=rngs)
    self.k = linear(cfg, t.hidden_size, kv_dim, (EMBED, KV), use_bias=t.attention_bias, rngs=rngs)
    self.v = linear(cfg, t.hidden_size, kv_dim, (EMBED, KV), use_bias=t.attention_bias, rngs=rngs)
    self.o = linear(cfg, q_dim, t.hidden_size, (HEADS, EMBED), use_bias=False, rngs=rngs)

  def __call__(self, x_BxLxE, cos_BxLxA, sin_BxLxA, mask_BxLxT, cache=None):
    """`cache`: None (attend to this call's own keys) or (k_BxKxTxD, v_BxKxTxD, start, prefill), this layer's.

    With a cache, the new keys/values go into slots [start, start+L) and queries attend over all T
    slots; returns (out, (k_BxKxTxD, v_BxKxTxD)). `prefill` (start is 0, statically): the slots before
    these L are empty, so queries attend over the L new keys alone, as they lie in the cache.
    """
    b, l, _ = x_BxLxE.shape
    q_BxLxHxD = self.q(x_BxLxE).reshape(b, l, self.num_heads, self.head_dim)
    k_BxLxKxD = self.k(x_BxLxE).reshape(b, l, self.num_kv_heads, self.head_dim)
    v_BxLxKxD = self.v(x_BxLxE).reshape(b, l, self.num_kv_heads, self.head_dim)
    q_BxLxHxD = apply_rope(q_BxLxHxD, cos_BxLxA, sin_BxLxA)
    k_BxLxKxD = apply_rope(k_BxLxKxD, cos_BxLxA, sin_BxLxA)
    if cache is None:
      out = gqa_attention(q_BxLxHxD, k_BxLxKxD, v_BxLxKxD, mask_BxLxT)
      return self.o(out), None
    k_BxKxTxD, v_BxKxTxD, start, prefill = cache
    heads_major = lambda x_BxLxKxD, dtype: jnp.swapaxes(x_BxLxKxD, 1, 2).astype(dtype)
    at = (0, 0, start, 0)
    k_BxKxTxD = jax.lax.dynamic_update_slice(k_BxKxTxD, heads_major(k_BxLxKxD, k_BxKxTxD.dtype), at)
    v_BxKxTxD = jax.lax.dynamic_update_slice(v_BxKxTxD, heads_major(v_BxLxKxD, v_BxKxTxD.dtype), at)
    if prefill:
      # Scores over L keys, not the cache's T slots: for the released t2i batch on one chip those were 6 GiB,
      # the sampler program's peak.
      as_cached = lambda x_BxLxKxD: x_BxLxKxD.astype(k_BxKxTxD.dtype).astype(q_BxLxHxD.dtype)
      out = gqa_attention(q_BxLxHxD, as_cached(k_BxLxKxD), as_cached(v_BxLxKxD), mask_BxLxT[:, :, :l])
    else:
      out = cached_gqa_attention(q_BxLxHxD, k_BxKxTxD.astype(q_BxLxHxD.dtype), v_BxKxTxD.astype(q_BxLxHxD.dtype),
                                 mask_BxLxT)
    return self.o(out), (k_BxKxTxD, v_BxKxTxD)


class GatedMLP(nnx.Module):
  """down(up * act(gate)) with gate and up in one [E, 2, I] kernel."""

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    t = cfg.text
    self.gate_up = StackedLinear(cfg, t.hidden_size, 2, t.intermediate_size, (EMBED, MLP), use_bias=False,
                                 rngs=rngs)
    self.down = linear(cfg, t.intermediate_size, t.hidden_size, (MLP, EMBED), use_bias=False, rngs=rngs)
    self.act = ACTIVATIONS[t.hidden_act]

  def __call__(self, x_BxLxE):
    gate_up_BxLx2xI = self.gate_up(x_BxLxE)
    return self.down(gate_up_BxLx2xI[..., 1, :] * self.act(gate_up_BxLx2xI[..., 0, :]))


class DecoderLayer(nnx.Module):
  """Pre-norm attention and MLP, each output normed again before the residual add."""

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    t = cfg.text
    self.input_layernorm = RMSNorm(cfg, t.hidden_size, t.rms_norm_eps, rngs=rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_self_attn_layernorm = RMSNorm(cfg, t.hidden_size, t.rms_norm_eps, rngs=rngs)
    self.post_attention_layernorm = RMSNorm(cfg, t.hidden_size, t.rms_norm_eps, rngs=rngs)
    self.mlp = GatedMLP(cfg, rngs=rngs)
    self.post_mlp_layernorm = RMSNorm(cfg, t.hidden_size, t.rms_norm_eps, rngs=rngs)

  def __call__(self, x_BxLxE, cos_BxLxA, sin_BxLxA, mask_BxLxT, cache=None):
    attn, cache = self.attn(self.input_layernorm(x_BxLxE), cos_BxLxA, sin_BxLxA, mask_BxLxT, cache)
    x_BxLxE = x_BxLxE + self.post_self_attn_layernorm(attn)
    x_BxLxE = x_BxLxE + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(x_BxLxE)))
    return x_BxLxE, cache


def _layer_no_cache(layer, x, cos, sin, mask):
  return layer(x, cos, sin, mask)[0]


class TextDecoder(nnx.Module):
  """Token embedding, decoder layers and the final RMSNorm."""

  def __init__(self, cfg: ARConfig, *, rngs: nnx.Rngs):
    t = cfg.text
    self.cfg = cfg
    self.embed = nnx.Embed(t.vocab_size, t.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                           embedding_metadata={"out_sharding": (VOCAB, EMBED)})
    self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(t.num_hidden_layers)])
    self.norm = RMSNorm(cfg, t.hidden_size, t.rms_norm_eps, rngs=rngs)

  def __call__(self, x_BxLxE, positions_3xBxL, valid_BxL):
    """Causal forward over embeddings without a cache; keys where valid_BxL is false are masked."""
    l = x_BxLxE.shape[1]
    cos, sin = mrope_cos_sin(self.cfg, positions_3xBxL)
    causal_LxL = jnp.tril(jnp.ones((l, l), bool))
    mask_BxLxL = causal_LxL[None] & valid_BxL.astype(bool)[:, None, :]
    run = nnx.remat(_layer_no_cache) if self.cfg.remat else _layer_no_cache
    for layer in self.layers:
      x_BxLxE = run(layer, constrain_batch(x_BxLxE), cos, sin, mask_BxLxL)
    return self.norm(x_BxLxE)

  def step(self, x_BxLxE, positions_3xBxL, key_valid_BxT, cache: KVCache, start):
    """Forward of L new tokens at cache slots [start, start+L); returns (normed h, new cache). A Python 0 as
    `start` is the prefill of an empty cache (see `Attention`)."""
    l = x_BxLxE.shape[1]
    t_len = cache.max_len
    prefill = isinstance(start, int) and start == 0
    start = jnp.asarray(start, jnp.int32)
    cos, sin = mrope_cos_sin(self.cfg, positions_3xBxL)
    slot_L = start + jnp.arange(l, dtype=jnp.int32)
    causal_LxT = jnp.arange(t_len, dtype=jnp.int32)[None, :] <= slot_L[:, None]
    mask_BxLxT = causal_LxT[None] & key_valid_BxT.astype(bool)[:, None, :]
    ks, vs = [], []
    for layer, k_BxKxTxD, v_BxKxTxD in zip(self.layers, cache.k, cache.v):
      x_BxLxE, (k_BxKxTxD, v_BxKxTxD) = layer(constrain_batch(x_BxLxE), cos, sin, mask_BxLxT,
                                              (k_BxKxTxD, v_BxKxTxD, start, prefill))
      ks.append(k_BxKxTxD)
      vs.append(v_BxKxTxD)
    return self.norm(x_BxLxE), KVCache(k=tuple(ks), v=tuple(vs))
