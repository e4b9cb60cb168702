"""The pre-norm transformer layer both CLIP towers stack (transformers `CLIPEncoderLayer`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.clip.config import ACTIVATIONS
from glmrl.sharding import EMBED, HEADS, KV, MLP


def linear(cfg, d_in: int, d_out: int, sharding, *, use_bias: bool = True, rngs: nnx.Rngs) -> nnx.Linear:
  """A Linear with logical sharding names on its kernel (and bias)."""
  return nnx.Linear(d_in, d_out, use_bias=use_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                    kernel_metadata={"out_sharding": sharding},
                    bias_metadata={"out_sharding": (sharding[1],)})


def layer_norm(cfg, width: int, eps: float, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
  # Two-pass variance, as torch's LayerNorm.
  return nnx.LayerNorm(width, epsilon=eps, use_fast_variance=False, dtype=cfg.dtype,
                       param_dtype=cfg.param_dtype, rngs=rngs,
                       scale_metadata={"out_sharding": (EMBED,)}, bias_metadata={"out_sharding": (EMBED,)})


def attend(q_BxLxHxK, k_BxTxHxK, v_BxTxHxK, mask_Bx1xLxT=None) -> jax.Array:
  """Scaled dot-product attention, logits and softmax in float32; [B, L, H * K]. A masked key gets the most
  negative finite logit, not -inf: a fully masked row (left padding) stays finite."""
  b, l, h, k = q_BxLxHxK.shape
  logits_BxHxLxT = jnp.einsum("blhk,bthk->bhlt", q_BxLxHxK, k_BxTxHxK,
                              preferred_element_type=jnp.float32) * (k ** -0.5)
  if mask_Bx1xLxT is not None:
    logits_BxHxLxT = jnp.where(mask_Bx1xLxT, logits_BxHxLxT, jnp.finfo(jnp.float32).min)
  probs_BxHxLxT = jax.nn.softmax(logits_BxHxLxT, axis=-1).astype(v_BxTxHxK.dtype)
  return jnp.einsum("bhlt,bthk->blhk", probs_BxHxLxT, v_BxTxHxK).reshape(b, l, h * k)


class Attention(nnx.Module):
  """Multi-head self-attention with biased q/k/v/out projections; softmax in float32."""

  def __init__(self, cfg, tower, *, rngs: nnx.Rngs):
    d = tower.hidden_size
    self.num_heads, self.head_dim = tower.num_attention_heads, tower.head_dim
    self.q = linear(cfg, d, d, (EMBED, HEADS), rngs=rngs)
    self.k = linear(cfg, d, d, (EMBED, KV), rngs=rngs)
    self.v = linear(cfg, d, d, (EMBED, KV), rngs=rngs)
    self.o = linear(cfg, d, d, (HEADS, EMBED), rngs=rngs)

  def __call__(self, x_BxLxD, mask_Bx1xLxT=None):
    b, l, _ = x_BxLxD.shape
    h, hd = self.num_heads, self.head_dim
    q_BxLxHxK = self.q(x_BxLxD).reshape(b, l, h, hd)
    k_BxLxHxK = self.k(x_BxLxD).reshape(b, l, h, hd)
    v_BxLxHxK = self.v(x_BxLxD).reshape(b, l, h, hd)
    return self.o(attend(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_Bx1xLxT))


class FeedForward(nnx.Module):

  def __init__(self, cfg, tower, *, rngs: nnx.Rngs):
    self.fc1 = linear(cfg, tower.hidden_size, tower.intermediate_size, (EMBED, MLP), rngs=rngs)
    self.fc2 = linear(cfg, tower.intermediate_size, tower.hidden_size, (MLP, EMBED), rngs=rngs)
    self.act = ACTIVATIONS[tower.hidden_act]

  def __call__(self, x_BxLxD):
    return self.fc2(self.act(self.fc1(x_BxLxD)))


class EncoderLayer(nnx.Module):
  """x + attn(norm1(x)), then + mlp(norm2(x))."""

  def __init__(self, cfg, tower, *, rngs: nnx.Rngs):
    self.norm1 = layer_norm(cfg, tower.hidden_size, tower.layer_norm_eps, rngs=rngs)
    self.attn = Attention(cfg, tower, rngs=rngs)
    self.norm2 = layer_norm(cfg, tower.hidden_size, tower.layer_norm_eps, rngs=rngs)
    self.mlp = FeedForward(cfg, tower, rngs=rngs)

  def __call__(self, x_BxLxD, mask_Bx1xLxT=None):
    x_BxLxD = x_BxLxD + self.attn(self.norm1(x_BxLxD), mask_Bx1xLxT)
    return x_BxLxD + self.mlp(self.norm2(x_BxLxD))
