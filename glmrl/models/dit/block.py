"""AdaLN-zero transformer block over the joint [glyph text; image] sequence."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from glmrl.models.dit.attention import attention
from glmrl.models.dit.config import DiTConfig
from glmrl.models.dit.layers import MLP, layer_norm, linear, modulate
from glmrl.models.dit.rope import apply_rope
from glmrl.sharding import EMBED, HEADS, MLP as MLP_AXIS

# Order of the 12 modulation vectors in the AdaLN projection (c_ = text stream).
_MOD_NAMES = ("shift_msa", "c_shift_msa", "scale_msa", "c_scale_msa", "gate_msa", "c_gate_msa",
              "shift_mlp", "c_shift_mlp", "scale_mlp", "c_scale_mlp", "gate_mlp", "c_gate_mlp")


class Attention(nnx.Module):
  """Joint self-attention with per-head LayerNorm on q/k and RoPE on the image tokens."""

  def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    e = cfg.inner_dim
    self.q = linear(cfg, e, e, (EMBED, HEADS), rngs=rngs)
    self.k = linear(cfg, e, e, (EMBED, HEADS), rngs=rngs)
    self.v = linear(cfg, e, e, (EMBED, HEADS), rngs=rngs)
    self.out = linear(cfg, e, e, (HEADS, EMBED), rngs=rngs)

  def __call__(self, x_BxSxE, cos_SxD, sin_SxD, key_valid_BxK=None, cached_kv=None):
    """Returns (output [B, S, E], (k, v) [B, S, H, D] of x for a cache write).

    cached_kv: (k, v) [B, C, H, D] prepended to x's keys/values; key_valid_BxK: bool over
    the C + S keys (None: all valid).
    """
    cfg = self.cfg
    b, s, _ = x_BxSxE.shape
    h, d = cfg.num_attention_heads, cfg.attention_head_dim
    q_BxSxHxD = layer_norm(self.q(x_BxSxE).reshape(b, s, h, d))
    k_BxSxHxD = layer_norm(self.k(x_BxSxE).reshape(b, s, h, d))
    v_BxSxHxD = self.v(x_BxSxE).reshape(b, s, h, d)
    q_BxSxHxD = apply_rope(q_BxSxHxD, cos_SxD, sin_SxD)
    k_BxSxHxD = apply_rope(k_BxSxHxD, cos_SxD, sin_SxD)
    k_all, v_all = k_BxSxHxD, v_BxSxHxD
    if cached_kv is not None:
      k_cache_BxCxHxD, v_cache_BxCxHxD = cached_kv
      k_all = jnp.concatenate([k_cache_BxCxHxD.astype(k_all.dtype), k_all], axis=1)
      v_all = jnp.concatenate([v_cache_BxCxHxD.astype(v_all.dtype), v_all], axis=1)
    mask = None if key_valid_BxK is None else key_valid_BxK[:, None, None, :]
    o_BxSxHxD = attention(q_BxSxHxD, k_all, v_all, mask, cfg.attention_impl, cfg.attention_block)
    return self.out(o_BxSxHxD.reshape(b, s, h * d)), (k_BxSxHxD, v_BxSxHxD)


class DiTBlock(nnx.Module):
  """Two streams (image, text) sharing attention and MLP weights, each with its own AdaLN-zero."""

  def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    e = cfg.inner_dim
    self.adaln = linear(cfg, cfg.time_embed_dim, 12 * e, (None, EMBED), rngs=rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp = MLP(cfg, e, cfg.ff_dim, e, "gelu_tanh", (EMBED, MLP_AXIS), (MLP_AXIS, EMBED), rngs=rngs)

  def __call__(self, img_BxXxE, txt_BxTxE, temb_BxC, cos_SxD, sin_SxD, key_valid_BxK=None, cached_kv=None):
    """Returns (image stream, text stream, (k, v) of this pass)."""
    b, t = txt_BxTxE.shape[:2]
    emb_Bx12xE = self.adaln(temb_BxC).reshape(b, 12, -1)
    m = {name: emb_Bx12xE[:, i] for i, name in enumerate(_MOD_NAMES)}

    x_BxSxE = jnp.concatenate([
        modulate(layer_norm(txt_BxTxE), m["c_shift_msa"], m["c_scale_msa"]),
        modulate(layer_norm(img_BxXxE), m["shift_msa"], m["scale_msa"]),
    ], axis=1)
    attn_BxSxE, kv = self.attn(x_BxSxE, cos_SxD, sin_SxD, key_valid_BxK, cached_kv)
    txt_BxTxE = txt_BxTxE + attn_BxSxE[:, :t] * m["c_gate_msa"][:, None]
    img_BxXxE = img_BxXxE + attn_BxSxE[:, t:] * m["gate_msa"][:, None]

    # One MLP call over both streams: the weights are shared and rows are independent.
    x_BxSxE = jnp.concatenate([
        modulate(layer_norm(txt_BxTxE), m["c_shift_mlp"], m["c_scale_mlp"]),
        modulate(layer_norm(img_BxXxE), m["shift_mlp"], m["scale_mlp"]),
    ], axis=1)
    ff_BxSxE = self.mlp(x_BxSxE)
    txt_BxTxE = txt_BxTxE + ff_BxSxE[:, :t] * m["c_gate_mlp"][:, None]
    img_BxXxE = img_BxXxE + ff_BxSxE[:, t:] * m["gate_mlp"][:, None]
    return img_BxXxE, txt_BxTxE, kv
