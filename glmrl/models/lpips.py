"""LPIPS (Zhang et al. 2018, "The Unreasonable Effectiveness of Deep Features"), VGG16 variant v0.1.

distance(x, y) = sum_l mean_hw( sum_c w_lc (n(f_l(x)) - n(f_l(y)))_c^2 ), where f_l are the VGG16
taps relu1_2 ... relu5_3 of the inputs after LPIPS' fixed scaling layer, n(.) divides each pixel's
feature vector by its L2 norm (+1e-10) and w_l are the learned non-negative 1x1 heads
(`lin{l}.model.1.weight` in the `lpips` package's `weights/v0.1/vgg.pth`). Inputs in [-1, 1];
uint8 images are mapped there as the package's `normalize=True` does for [0, 1].

Weights: a folder written by `python -m checkpoints_convert.lpips` (config.json + params/),
read by `load_lpips`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.models.stored_module import load_module
from glmrl.models.vgg import VGG16Config, VGG16Features
from glmrl.sharding import CONV_IN, CONV_OUT

# LPIPS' ScalingLayer: (x - shift) / scale, applied to [-1, 1] inputs (v0.1 only; v0.0 skipped it).
SHIFT = (-0.030, -0.088, -0.188)
SCALE = (0.458, 0.448, 0.450)
NORM_EPS = 1e-10


@dataclasses.dataclass(frozen=True)
class LPIPSConfig:
  vgg: VGG16Config = dataclasses.field(default_factory=VGG16Config)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    # The trunk computes in the same dtypes as the heads.
    if (self.vgg.dtype, self.vgg.param_dtype) != (self.dtype, self.param_dtype):
      object.__setattr__(self, "vgg", dataclasses.replace(self.vgg, dtype=self.dtype,
                                                          param_dtype=self.param_dtype))

  @classmethod
  def from_hf(cls, config_dict: dict) -> "LPIPSConfig":
    """From the config.json the LPIPS converter writes: {"net": "vgg", "version": "0.1", "vgg": {...}}."""
    net, version = config_dict.get("net"), config_dict.get("version")
    if net != "vgg" or version != "0.1":
      raise ValueError(f"LPIPS config: only net='vgg' version='0.1' is supported, got net={net!r} "
                       f"version={version!r}")
    unknown = sorted(set(config_dict) - {"net", "version", "vgg"})
    if unknown:
      raise ValueError(f"LPIPS config: unknown key(s) {unknown}")
    return cls(vgg=VGG16Config.from_hf(config_dict.get("vgg", {})))

  def to_hf(self) -> dict:
    return {"net": "vgg", "version": "0.1", "vgg": self.vgg.to_hf()}

  @classmethod
  def full(cls, **overrides) -> "LPIPSConfig":
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides) -> "LPIPSConfig":
    return cls(**{"vgg": VGG16Config.tiny(), **overrides})


class LPIPS(nnx.Module):
  """(x, y) [B, H, W, 3], uint8 or float in [-1, 1] -> LPIPS distance [B] (float32)."""

  def __init__(self, cfg: LPIPSConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.vgg = VGG16Features(cfg.vgg, rngs=rngs)
    self.heads = nnx.List([
        nnx.Conv(c, 1, (1, 1), use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                 kernel_metadata={"out_sharding": (None, None, CONV_IN, CONV_OUT)})
        for c in cfg.vgg.block_channels])

  def __call__(self, x_Bxhxwx3: jax.Array, y_Bxhxwx3: jax.Array) -> jax.Array:
    if x_Bxhxwx3.shape != y_Bxhxwx3.shape or x_Bxhxwx3.dtype != y_Bxhxwx3.dtype:
      raise ValueError(f"LPIPS inputs differ: {x_Bxhxwx3.dtype}{list(x_Bxhxwx3.shape)} vs "
                       f"{y_Bxhxwx3.dtype}{list(y_Bxhxwx3.shape)}")
    batch = x_Bxhxwx3.shape[0]
    # One trunk pass over both halves: fewer, larger convolutions.
    taps = self.vgg(scale_input(jnp.concatenate([jnp.asarray(x_Bxhxwx3), jnp.asarray(y_Bxhxwx3)])))
    total_B = jnp.zeros((batch,), jnp.float32)
    for f_2BxhxwxC, head in zip(taps, self.heads):
      fx_BxhxwxC = f_2BxhxwxC[:batch].astype(jnp.float32)
      fy_BxhxwxC = f_2BxhxwxC[batch:].astype(jnp.float32)
      diff_BxhxwxC = jnp.square(_unit_features(fx_BxhxwxC) - _unit_features(fy_BxhxwxC))
      # XLA may round the two normalisations differently (vectorised vs scalar division), so equal
      # feature vectors can leave ~1e-8 residue; their exact difference is 0, so zero them.
      same_Bxhxwx1 = jnp.all(fx_BxhxwxC == fy_BxhxwxC, axis=-1, keepdims=True)
      diff_BxhxwxC = jnp.where(same_Bxhxwx1, 0.0, diff_BxhxwxC)
      # The 1x1 head and the spatial mean commute; weighting after the mean avoids an [B, h, w] map.
      w_C = head.kernel[0, 0, :, 0].astype(jnp.float32)
      hw = diff_BxhxwxC.shape[1] * diff_BxhxwxC.shape[2]
      total_B = total_B + jnp.einsum("bhwc,c->b", diff_BxhxwxC, w_C) / hw
    return total_B


def _uint8_table() -> np.ndarray:
  """[256, 3] float32: ScalingLayer(v / 127.5 - 1) for every byte value, in torch's op order."""
  v = np.arange(256, dtype=np.float32)[:, None] / np.float32(127.5) - np.float32(1.0)
  return (v - np.asarray(SHIFT, np.float32)) / np.asarray(SCALE, np.float32)


def scale_input(x_Bxhxwx3: jax.Array) -> jax.Array:
  """LPIPS' ScalingLayer on [-1, 1] floats; uint8 [0, 255] goes through an exact lookup table.

  The table makes the uint8 path bit-reproducible: XLA may fuse (and round) the same arithmetic
  differently on the two sides of the comparison.
  """
  x_Bxhxwx3 = jnp.asarray(x_Bxhxwx3)
  if x_Bxhxwx3.dtype == jnp.uint8:
    return jnp.asarray(_uint8_table())[x_Bxhxwx3.astype(jnp.int32), jnp.arange(3)]
  shift, scale = jnp.asarray(SHIFT, jnp.float32), jnp.asarray(SCALE, jnp.float32)
  return (x_Bxhxwx3.astype(jnp.float32) - shift) / scale


def _unit_features(f_BxhxwxC: jax.Array) -> jax.Array:
  """Each feature vector (last axis) divided by its L2 norm (+eps, so all-zero ReLU outputs stay 0)."""
  norm_Bxhxwx1 = jnp.sqrt(jnp.sum(jnp.square(f_BxhxwxC), axis=-1, keepdims=True))
  return f_BxhxwxC / (norm_Bxhxwx1 + NORM_EPS)


def load_lpips(weights_dir: str, sharding=None, **config_overrides) -> LPIPS:
  """The LPIPS model stored by `python -m checkpoints_convert.lpips` in `weights_dir` (`load_module`)."""
  return load_module(weights_dir, LPIPSConfig, LPIPS, sharding, **config_overrides,
                                how_to_make="convert the published files with `python -m checkpoints_convert.lpips`")
