"""Configuration of the GLM-Image DiT decoder (diffusers `GlmImageTransformer2DModel`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax.numpy as jnp

from glmrl.errors import UserError
from glmrl.models.config_fields import HFConfig, check_positive_ints
from glmrl.models.dit import attention

HF_CLASS_NAME = "GlmImageTransformer2DModel"

# Fields of `transformer/config.json`, in the reference constructor's order.
HF_FIELDS = (
    "patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim",
    "num_attention_heads", "text_embed_dim", "time_embed_dim", "condition_dim",
    "prior_vq_quantizer_codebook_size",
)

# The reference constructor's defaults: a config.json that omits a field gets these
# (they are not the released values; see `DiTConfig.full`).
_HF_DEFAULTS = dict(
    patch_size=2, in_channels=16, out_channels=16, num_layers=30, attention_head_dim=40,
    num_attention_heads=64, text_embed_dim=1472, time_embed_dim=512, condition_dim=256,
    prior_vq_quantizer_codebook_size=16384,
)

_VALID_ATTENTION_IMPLS = (None, *attention.IMPLS)


@dataclasses.dataclass(frozen=True)
class DiTConfig(HFConfig):
  """DiT hyper-parameters (HF names) plus runtime options; `to_hf()` is the `transformer/config.json` dict
  (loadable by `GlmImageTransformer2DModel.from_config`).

  `dtype`: compute dtype; `param_dtype`: parameter dtype; `attention_impl`: the attention kernel
  (`attention.IMPLS`; None = "xla", `attention.xla`; "cudnn" = flash attention on NVIDIA GPUs in bf16/fp16;
  "blocked" = `attention.query_blocked`, `attention_block` queries at a time; "splash" on TPU); `remat`: rematerialise each block in the
  backward pass; `cfg_batched`: classifier-free guidance runs its conditional and unconditional branches as one
  forward of twice the batch (`glmrl.sampling.decode.guided_velocity`). The runtime options are not part of the
  HF config.
  """
  HF_DEFAULTS = _HF_DEFAULTS
  HF_FIXED = {"_class_name": HF_CLASS_NAME}
  RUNTIME = ("dtype", "param_dtype", "attention_impl", "attention_block", "remat", "cfg_batched")
  patch_size: int = 2
  in_channels: int = 16
  out_channels: int = 16
  num_layers: int = 30
  attention_head_dim: int = 128
  num_attention_heads: int = 32
  text_embed_dim: int = 1472
  time_embed_dim: int = 512
  condition_dim: int = 256
  prior_vq_quantizer_codebook_size: int = 16384
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  attention_impl: str | None = None
  attention_block: int = 512
  remat: bool = False
  cfg_batched: bool = False

  def __post_init__(self):
    check_positive_ints(self, HF_FIELDS)
    # 2D RoPE splits each head into a height and a width half, each rotated in pairs.
    if self.attention_head_dim % 4:
      raise UserError(f"DiTConfig.attention_head_dim={self.attention_head_dim} must be divisible by 4")
    if isinstance(self.attention_block, bool) or not isinstance(self.attention_block, int) or self.attention_block < 1:
      raise UserError(f"DiTConfig.attention_block={self.attention_block!r} must be a positive int")
    if self.attention_impl not in _VALID_ATTENTION_IMPLS:
      raise UserError(f"DiTConfig.attention_impl={self.attention_impl!r} must be one of {_VALID_ATTENTION_IMPLS}")

  @property
  def inner_dim(self) -> int:
    """Residual stream width: heads x head_dim."""
    return self.num_attention_heads * self.attention_head_dim

  @property
  def ff_dim(self) -> int:
    return 4 * self.inner_dim

  @property
  def pooled_condition_dim(self) -> int:
    """Width of the sinusoidal (crop_coords, target_size) features: 2 conditions x 2 values."""
    return 4 * self.condition_dim

  @classmethod
  def from_hf(cls, config_dict: dict, **overrides) -> "DiTConfig":
    """From `transformer/config.json` as a dict; `overrides` set runtime fields (dtype, ...)."""
    if not isinstance(config_dict, dict):
      raise UserError(f"config_dict must be a dict, got {type(config_dict).__name__}")
    class_name = config_dict.get("_class_name", HF_CLASS_NAME)
    if class_name != HF_CLASS_NAME:
      raise UserError(f"_class_name={class_name!r}, expected {HF_CLASS_NAME!r}")
    unknown = sorted(k for k in config_dict if not k.startswith("_") and k not in HF_FIELDS)
    if unknown:
      # diffusers ignores unexpected config keys too; none of them changes the architecture.
      logging.warning("DiTConfig.from_hf ignores unknown keys %s", unknown)
    bad = sorted(set(overrides) & set(HF_FIELDS))
    if bad:
      raise UserError(f"overrides {bad} are HF fields: put them in config_dict")
    values = {k: config_dict.get(k, _HF_DEFAULTS[k]) for k in HF_FIELDS}
    return cls(**values, **overrides)

  @classmethod
  def full(cls, **overrides) -> "DiTConfig":
    """The released GLM-Image DiT (6,926,882,880 parameters)."""
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides) -> "DiTConfig":
    """A 64k-parameter model for tests."""
    values = dict(
        patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=16,
        num_attention_heads=2, text_embed_dim=24, time_embed_dim=32, condition_dim=8,
        prior_vq_quantizer_codebook_size=64,
    )
    values.update(overrides)
    return cls(**values)
