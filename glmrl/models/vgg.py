"""VGG16 convolutional trunk (torchvision `vgg16().features`) returning the five ReLU taps LPIPS uses.

The trunk is fixed at VGG16's depth (2, 2, 3, 3, 3 convolutions per block, 3x3, padding 1, ReLU,
2x2 max pooling between blocks); only the widths are configurable so tests can shrink it. Inputs are
NHWC; the caller normalises them. The last pooling layer of torchvision's `features` (index 30)
follows relu5_3 and is never needed, so it is left out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.config_fields import HFConfig
from glmrl.sharding import CONV_IN, CONV_OUT

CONVS_PER_BLOCK = (2, 2, 3, 3, 3)
TAP_NAMES = ("relu1_2", "relu2_2", "relu3_3", "relu4_3", "relu5_3")


def torchvision_conv_indices() -> tuple[int, ...]:
  """Positions of the convolutions in torchvision's `vgg16().features` (conv, relu, ..., pool)."""
  indices, pos = [], 0
  for n in CONVS_PER_BLOCK:
    for _ in range(n):
      indices.append(pos)
      pos += 2  # conv, relu
    pos += 1  # max pool
  return tuple(indices)


@dataclasses.dataclass(frozen=True)
class VGG16Config(HFConfig):
  RUNTIME = ("dtype", "param_dtype")
  block_channels: tuple[int, ...] = (64, 128, 256, 512, 512)
  in_channels: int = 3
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    object.__setattr__(self, "block_channels", tuple(int(c) for c in self.block_channels))
    if len(self.block_channels) != len(CONVS_PER_BLOCK):
      raise ValueError(f"block_channels={self.block_channels} must have {len(CONVS_PER_BLOCK)} entries "
                       "(VGG16's five blocks)")
    if any(c < 1 for c in self.block_channels) or self.in_channels < 1:
      raise ValueError(f"channels must be positive: block_channels={self.block_channels}, "
                       f"in_channels={self.in_channels}")

  @property
  def conv_channels(self) -> tuple[tuple[int, int], ...]:
    """(in, out) channels of the 13 convolutions in order."""
    out, cin = [], self.in_channels
    for n, c in zip(CONVS_PER_BLOCK, self.block_channels):
      for _ in range(n):
        out.append((cin, c))
        cin = c
    return tuple(out)

  @classmethod
  def from_hf(cls, config_dict: dict) -> "VGG16Config":
    """From the `vgg` entry our LPIPS converter writes (torchvision ships no config file)."""
    unknown = sorted(set(config_dict) - {"block_channels", "in_channels"})
    if unknown:
      raise ValueError(f"VGG16 config: unknown key(s) {unknown}")
    return cls(**{k: tuple(v) if k == "block_channels" else v for k, v in config_dict.items()})

  @classmethod
  def full(cls, **overrides) -> "VGG16Config":
    """torchvision `vgg16` widths."""
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides) -> "VGG16Config":
    return cls(**{"block_channels": (4, 8, 8, 16, 16), **overrides})


class VGG16Features(nnx.Module):
  """x [B, H, W, C] -> the five taps relu1_2 ... relu5_3 (each [B, H / 2^k, W / 2^k, C_k])."""

  def __init__(self, cfg: VGG16Config, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.convs = nnx.List([
        nnx.Conv(cin, cout, (3, 3), padding=((1, 1), (1, 1)), dtype=cfg.dtype,
                 param_dtype=cfg.param_dtype, rngs=rngs,
                 kernel_metadata={"out_sharding": (None, None, CONV_IN, CONV_OUT)},
                 bias_metadata={"out_sharding": (CONV_OUT,)})
        for cin, cout in cfg.conv_channels])

  def __call__(self, x_BxhxwxC: jax.Array) -> list[jax.Array]:
    if x_BxhxwxC.ndim != 4 or x_BxhxwxC.shape[-1] != self.cfg.in_channels:
      raise ValueError(f"VGG16 input must be [B, H, W, {self.cfg.in_channels}], got {x_BxhxwxC.shape}")
    if min(x_BxhxwxC.shape[1:3]) < 2 ** (len(CONVS_PER_BLOCK) - 1):
      raise ValueError(f"VGG16 input {x_BxhxwxC.shape} is smaller than 16 px: the fifth block would be empty")
    h = x_BxhxwxC.astype(self.cfg.dtype)
    taps, i = [], 0
    for block, n in enumerate(CONVS_PER_BLOCK):
      if block:
        # torchvision's MaxPool2d(2, 2) floors odd sizes, as VALID pooling does.
        h = nnx.max_pool(h, (2, 2), strides=(2, 2), padding="VALID")
      for _ in range(n):
        h = jax.nn.relu(self.convs[i](h))
        i += 1
      taps.append(h)
    return taps
