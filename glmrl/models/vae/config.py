"""Config of the GLM-Image VAE (diffusers `AutoencoderKL`, `vae/config.json`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from glmrl.errors import UserError

_DOWN = "DownEncoderBlock2D"
_UP = "UpDecoderBlock2D"

# Per-channel latent statistics of the released VAE. The released vae/config.json was not
# available here; these values (and the architecture of `full()`) are the ones FastVideo's
# GLM-Image VAE config ships (hao-ai-lab/FastVideo, fastvideo/configs/models/vaes/glm_image.py).
# `from_hf` on the real config.json overrides them.
_GLM_IMAGE_LATENTS_MEAN = (
    -0.2080078125, 1.875, -0.470703125, -1.265625, -1.421875, 0.77734375, -0.3671875, -0.9453125,
    0.318359375, 0.7734375, -0.1884765625, -0.022216796875, -0.220703125, -1.59375, -0.81640625,
    -0.255859375)
_GLM_IMAGE_LATENTS_STD = (
    3.0625, 2.203125, 2.265625, 4.84375, 2.5, 3.9375, 2.203125, 3.03125, 2.1875, 2.046875,
    2.71875, 2.390625, 2.390625, 2.453125, 2.25, 2.15625)


@dataclasses.dataclass(frozen=True)
class VAEConfig:
  in_channels: int = 3
  out_channels: int = 3
  block_out_channels: tuple[int, ...] = (128, 512, 1024, 1024)
  layers_per_block: int = 3
  latent_channels: int = 16
  norm_num_groups: int = 32
  mid_block_add_attention: bool = False
  use_quant_conv: bool = False
  use_post_quant_conv: bool = False
  latents_mean: tuple[float, ...] | None = _GLM_IMAGE_LATENTS_MEAN
  latents_std: tuple[float, ...] | None = _GLM_IMAGE_LATENTS_STD
  # Carried for `to_hf` round trips; the GLM-Image pipeline normalises with
  # latents_mean / latents_std and never reads these.
  scaling_factor: float = 0.18215
  shift_factor: float | None = None
  force_upcast: bool = True
  sample_size: int = 1024
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  # Not a diffusers field: the decoder computes at most this many rows at a time (`bands`); the result does
  # not depend on it beyond rounding.
  band_rows: int = 64

  def __post_init__(self):
    object.__setattr__(self, "block_out_channels", tuple(int(c) for c in self.block_out_channels))
    for name in ("latents_mean", "latents_std"):
      v = getattr(self, name)
      if v is not None:
        v = tuple(float(x) for x in v)
        object.__setattr__(self, name, v)
        if len(v) != self.latent_channels:
          raise UserError(f"{name} has {len(v)} entries, expected latent_channels={self.latent_channels}")
    if not self.block_out_channels:
      raise UserError("block_out_channels must not be empty")
    for c in self.block_out_channels:
      if c % self.norm_num_groups:
        raise UserError(f"block_out_channels entry {c} is not divisible by norm_num_groups={self.norm_num_groups}")
    if self.band_rows < 1:
      raise UserError(f"band_rows={self.band_rows} must be >= 1")
    if self.layers_per_block < 1:
      raise UserError(f"layers_per_block={self.layers_per_block} must be >= 1")

  @property
  def scale_factor(self) -> int:
    """Pixel-to-latent downsampling factor (the pipeline's `vae_scale_factor`)."""
    return 2 ** (len(self.block_out_channels) - 1)

  @classmethod
  def full(cls, **overrides) -> "VAEConfig":
    """GLM-Image: 16 latent channels, 8x downsampling (values: see the module comment)."""
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides) -> "VAEConfig":
    kw = dict(block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
              mid_block_add_attention=True, use_quant_conv=True, use_post_quant_conv=True,
              latents_mean=(0.1, -0.2, 0.3, 0.0), latents_std=(1.5, 0.5, 2.0, 1.0), sample_size=32)
    kw.update(overrides)
    return cls(**kw)

  @classmethod
  def from_hf(cls, config: dict[str, Any], **overrides) -> "VAEConfig":
    act = config.get("act_fn", "silu")
    if act != "silu":
      raise UserError(f"act_fn={act!r} is not supported (only 'silu')")
    n = len(config.get("block_out_channels", (64,)))
    down = tuple(config.get("down_block_types", (_DOWN,)))
    up = tuple(config.get("up_block_types", (_UP,)))
    if down != (_DOWN,) * n:
      raise UserError(f"down_block_types={down} is not supported (only {_DOWN} x {n})")
    if up != (_UP,) * n:
      raise UserError(f"up_block_types={up} is not supported (only {_UP} x {n})")
    # AutoencoderKL's own defaults, for keys a config.json leaves out.
    kw = dict(in_channels=3, out_channels=3, block_out_channels=(64,), layers_per_block=1,
              latent_channels=4, norm_num_groups=32, mid_block_add_attention=True,
              use_quant_conv=True, use_post_quant_conv=True, latents_mean=None, latents_std=None,
              scaling_factor=0.18215, shift_factor=None, force_upcast=True, sample_size=32)
    for k in kw:
      if k in config:
        kw[k] = config[k]
    if isinstance(kw["sample_size"], (list, tuple)):
      raise UserError(f"sample_size={kw['sample_size']!r}: only an int is supported")
    kw.update(overrides)
    return cls(**kw)

  def to_hf(self) -> dict[str, Any]:
    n = len(self.block_out_channels)
    return {
        "_class_name": "AutoencoderKL",
        "act_fn": "silu",
        "block_out_channels": list(self.block_out_channels),
        "down_block_types": [_DOWN] * n,
        "up_block_types": [_UP] * n,
        "in_channels": self.in_channels,
        "out_channels": self.out_channels,
        "latent_channels": self.latent_channels,
        "layers_per_block": self.layers_per_block,
        "norm_num_groups": self.norm_num_groups,
        "mid_block_add_attention": self.mid_block_add_attention,
        "use_quant_conv": self.use_quant_conv,
        "use_post_quant_conv": self.use_post_quant_conv,
        "latents_mean": None if self.latents_mean is None else list(self.latents_mean),
        "latents_std": None if self.latents_std is None else list(self.latents_std),
        "scaling_factor": self.scaling_factor,
        "shift_factor": self.shift_factor,
        "force_upcast": self.force_upcast,
        "sample_size": self.sample_size,
    }
