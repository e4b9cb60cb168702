"""Building blocks of the AutoencoderKL encoder/decoder (NHWC activations, HWIO kernels)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.vae.config import VAEConfig
from glmrl.sharding import CONV_IN, CONV_OUT

# diffusers builds every VAE GroupNorm with this epsilon, whatever the config says.
_EPS = 1e-6


def conv(cfg: VAEConfig, cin: int, cout: int, k: int, *, stride: int = 1, padding=None,
         rngs: nnx.Rngs) -> nnx.Conv:
  if padding is None:
    padding = ((k // 2, k // 2),) * 2
  return nnx.Conv(cin, cout, (k, k), strides=stride, padding=padding, dtype=cfg.dtype,
                  param_dtype=cfg.param_dtype, rngs=rngs,
                  kernel_metadata={"out_sharding": (None, None, CONV_IN, CONV_OUT)},
                  bias_metadata={"out_sharding": (CONV_OUT,)})


def group_norm(cfg: VAEConfig, channels: int, *, rngs: nnx.Rngs) -> nnx.GroupNorm:
  # Two-pass variance, like torch.nn.GroupNorm; the fast E[x^2]-E[x]^2 form loses precision
  # on activations with a large mean.
  return nnx.GroupNorm(channels, num_groups=cfg.norm_num_groups, epsilon=_EPS, dtype=cfg.dtype,
                       param_dtype=cfg.param_dtype, use_fast_variance=False, rngs=rngs,
                       scale_metadata={"out_sharding": (CONV_OUT,)},
                       bias_metadata={"out_sharding": (CONV_OUT,)})


class ResnetBlock(nnx.Module):
  """GroupNorm-SiLU-Conv twice with a residual (1x1 conv when the width changes)."""

  def __init__(self, cfg: VAEConfig, cin: int, cout: int, *, rngs: nnx.Rngs):
    self.norm1 = group_norm(cfg, cin, rngs=rngs)
    self.conv1 = conv(cfg, cin, cout, 3, rngs=rngs)
    self.norm2 = group_norm(cfg, cout, rngs=rngs)
    self.conv2 = conv(cfg, cout, cout, 3, rngs=rngs)
    self.conv_shortcut = conv(cfg, cin, cout, 1, rngs=rngs) if cin != cout else None

  def __call__(self, x_BxhxwxC):
    h = self.conv1(jax.nn.silu(self.norm1(x_BxhxwxC)))
    h = self.conv2(jax.nn.silu(self.norm2(h)))
    skip = x_BxhxwxC if self.conv_shortcut is None else self.conv_shortcut(x_BxhxwxC)
    return skip + h


class Downsample(nnx.Module):
  """Stride-2 3x3 conv after zero-padding one row/column at the bottom/right only."""

  def __init__(self, cfg: VAEConfig, channels: int, *, rngs: nnx.Rngs):
    self.conv = conv(cfg, channels, channels, 3, stride=2, padding=((0, 1), (0, 1)), rngs=rngs)

  def __call__(self, x_BxhxwxC):
    return self.conv(x_BxhxwxC)


class Upsample(nnx.Module):
  """Nearest-neighbour 2x upsampling followed by a 3x3 conv."""

  def __init__(self, cfg: VAEConfig, channels: int, *, rngs: nnx.Rngs):
    self.conv = conv(cfg, channels, channels, 3, rngs=rngs)

  def __call__(self, x_BxhxwxC):
    x = jnp.repeat(jnp.repeat(x_BxhxwxC, 2, axis=1), 2, axis=2)
    return self.conv(x)


class SpatialAttention(nnx.Module):
  """Single-head self-attention over all H*W positions with a residual (the mid block's)."""

  def __init__(self, cfg: VAEConfig, channels: int, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.group_norm = group_norm(cfg, channels, rngs=rngs)

    def linear():
      return nnx.Linear(channels, channels, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                        kernel_metadata={"out_sharding": (CONV_IN, CONV_OUT)},
                        bias_metadata={"out_sharding": (CONV_OUT,)})

    self.to_q, self.to_k, self.to_v, self.to_out = linear(), linear(), linear(), linear()

  def __call__(self, x_BxhxwxC):
    b, h, w, c = x_BxhxwxC.shape
    t_BxTxC = self.group_norm(x_BxhxwxC).reshape(b, h * w, c)
    q_BxLxC, k_BxTxC, v_BxTxC = self.to_q(t_BxTxC), self.to_k(t_BxTxC), self.to_v(t_BxTxC)
    logits_BxLxT = jnp.einsum("btc,bsc->bts", q_BxLxC, k_BxTxC,
                              preferred_element_type=jnp.float32) * (c ** -0.5)
    # Softmax in float32 (the reference upcasts the softmax of this block).
    probs_BxLxT = jax.nn.softmax(logits_BxLxT, axis=-1).astype(v_BxTxC.dtype)
    o_BxLxC = jnp.einsum("bts,bsc->btc", probs_BxLxT, v_BxTxC)
    return x_BxhxwxC + self.to_out(o_BxLxC).reshape(b, h, w, c)


class MidBlock(nnx.Module):
  """ResnetBlock, [SpatialAttention], ResnetBlock at the bottleneck width."""

  def __init__(self, cfg: VAEConfig, channels: int, *, rngs: nnx.Rngs):
    self.resnets = nnx.List([ResnetBlock(cfg, channels, channels, rngs=rngs) for _ in range(2)])
    self.attention = SpatialAttention(cfg, channels, rngs=rngs) if cfg.mid_block_add_attention else None

  def __call__(self, x_BxhxwxC):
    x = self.resnets[0](x_BxhxwxC)
    if self.attention is not None:
      x = self.attention(x)
    return self.resnets[1](x)


class DownBlock(nnx.Module):
  def __init__(self, cfg: VAEConfig, cin: int, cout: int, *, downsample: bool, rngs: nnx.Rngs):
    self.resnets = nnx.List([ResnetBlock(cfg, cin if j == 0 else cout, cout, rngs=rngs)
                             for j in range(cfg.layers_per_block)])
    self.downsample = Downsample(cfg, cout, rngs=rngs) if downsample else None

  def __call__(self, x_BxhxwxC):
    for resnet in self.resnets:
      x_BxhxwxC = resnet(x_BxhxwxC)
    return x_BxhxwxC if self.downsample is None else self.downsample(x_BxhxwxC)


class UpBlock(nnx.Module):
  def __init__(self, cfg: VAEConfig, cin: int, cout: int, *, upsample: bool, rngs: nnx.Rngs):
    # The decoder has one more resnet per level than the encoder.
    self.resnets = nnx.List([ResnetBlock(cfg, cin if j == 0 else cout, cout, rngs=rngs)
                             for j in range(cfg.layers_per_block + 1)])
    self.upsample = Upsample(cfg, cout, rngs=rngs) if upsample else None

  def __call__(self, x_BxhxwxC):
    for resnet in self.resnets:
      x_BxhxwxC = resnet(x_BxhxwxC)
    return x_BxhxwxC if self.upsample is None else self.upsample(x_BxhxwxC)
