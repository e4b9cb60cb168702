"""Small building blocks of the DiT: sharded linear layers, parameter-free LayerNorm, MLP."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.dit.config import DiTConfig

LN_EPS = 1e-5


def linear(cfg: DiTConfig, d_in: int, d_out: int, sharding: tuple, *, rngs: nnx.Rngs) -> nnx.Linear:
  """nnx.Linear with bias whose kernel [in, out] carries `sharding` and bias its output name."""
  return nnx.Linear(
      d_in, d_out, use_bias=True, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
      kernel_metadata={"out_sharding": tuple(sharding)},
      bias_metadata={"out_sharding": (sharding[1],)})


def layer_norm(x: jax.Array, eps: float = LN_EPS) -> jax.Array:
  """LayerNorm over the last axis without affine parameters, computed in float32."""
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  centered = x32 - mean
  var = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
  return (centered * jax.lax.rsqrt(var + eps)).astype(x.dtype)


def modulate(x_BxLxE: jax.Array, shift_BxE: jax.Array, scale_BxE: jax.Array) -> jax.Array:
  return x_BxLxE * (1 + scale_BxE[:, None, :]) + shift_BxE[:, None, :]


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
}


class MLP(nnx.Module):
  """fc2(act(fc1(x))): diffusers `FeedForward` without its (inactive) dropout."""

  def __init__(self, cfg: DiTConfig, d_in: int, d_hidden: int, d_out: int, activation: str,
               sharding_in: tuple, sharding_out: tuple, *, rngs: nnx.Rngs):
    if activation not in ACTIVATIONS:
      raise ValueError(f"activation={activation!r} must be one of {sorted(ACTIVATIONS)}")
    self.activation = activation
    self.fc1 = linear(cfg, d_in, d_hidden, sharding_in, rngs=rngs)
    self.fc2 = linear(cfg, d_hidden, d_out, sharding_out, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))
