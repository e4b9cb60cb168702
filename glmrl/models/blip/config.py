"""Configuration of ImageReward: BLIP's ViT, its BERT text encoder with cross-attention, the MLP head.

The released model (THUDM/ImageReward `ImageReward.pt` with its `med_config.json`) is BLIP's ViT-L/16 at 224 px
(`create_vit('large')`: 1024 wide, 24 layers, 16 heads, LayerNorm eps 1e-6) and bert-base as BLIP's "med" text
encoder (768 wide, 12 layers, 12 heads, vocabulary 30524 with BLIP's [DEC] and [ENC], eps 1e-12), every layer
cross-attending to the ViT's tokens, and an MLP 768 -> 1024 -> 128 -> 64 -> 16 -> 1 on the text's first token.
`config.json` of a converted folder holds these fields (`to_hf`); the score's normalisation is the released
model's constants (`ImageReward.mean` / `.std`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from glmrl.errors import UserError
from glmrl.models.config_fields import HFConfig, check_positive_ints

MODEL_TYPE = "image_reward"
# ImageReward.__init__: the raw head output is (x - mean) / std.
MEAN, STD = 0.16717362830052426, 1.0333394966054072


@dataclasses.dataclass(frozen=True)
class BlipVisionConfig:
  """BLIP's ViT (`models/vit.py` VisionTransformer): pre-norm blocks, exact GELU, MLP ratio 4, final LayerNorm
  over every token."""
  hidden_size: int = 1024
  num_hidden_layers: int = 24
  num_attention_heads: int = 16
  image_size: int = 224
  patch_size: int = 16
  layer_norm_eps: float = 1e-6
  num_channels: int = 3
  hidden_act: str = "gelu"

  def __post_init__(self):
    check_positive_ints(self, ("hidden_size", "num_hidden_layers", "num_attention_heads", "image_size",
                               "patch_size", "num_channels"))
    if self.hidden_size % self.num_attention_heads:
      raise UserError(f"BlipVisionConfig.hidden_size={self.hidden_size} is not divisible by "
                      f"num_attention_heads={self.num_attention_heads}")
    if self.image_size % self.patch_size:
      raise UserError(f"BlipVisionConfig.image_size={self.image_size} is not a multiple of "
                      f"patch_size={self.patch_size}")

  @property
  def intermediate_size(self) -> int:
    return 4 * self.hidden_size

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @property
  def num_positions(self) -> int:
    return self.grid ** 2 + 1


@dataclasses.dataclass(frozen=True)
class BlipTextConfig:
  """BLIP's `med.py` BertModel as ImageReward builds it: word and position embeddings (no token types), post-norm
  layers of self-attention, cross-attention to the image (keys and values from `encoder_width`), GELU FFN."""
  vocab_size: int = 30524
  hidden_size: int = 768
  intermediate_size: int = 3072
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  max_position_embeddings: int = 512
  layer_norm_eps: float = 1e-12
  encoder_width: int = 1024
  hidden_act: str = "gelu"

  def __post_init__(self):
    check_positive_ints(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "max_position_embeddings", "encoder_width"))
    if self.hidden_size % self.num_attention_heads:
      raise UserError(f"BlipTextConfig.hidden_size={self.hidden_size} is not divisible by "
                      f"num_attention_heads={self.num_attention_heads}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads


@dataclasses.dataclass(frozen=True)
class ImageRewardConfig(HFConfig):
  """Both encoders, the head's hidden widths, the score's normalisation and the prompt length ImageReward
  tokenizes to (35, padded); dtypes are runtime options."""
  HF_FIXED = {"model_type": MODEL_TYPE}
  RUNTIME = ("dtype", "param_dtype")
  vision: BlipVisionConfig = BlipVisionConfig()
  text: BlipTextConfig = BlipTextConfig()
  head_hidden: tuple[int, ...] = (1024, 128, 64, 16)
  mean: float = MEAN
  std: float = STD
  max_prompt_tokens: int = 35
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    object.__setattr__(self, "head_hidden", tuple(self.head_hidden))
    check_positive_ints(self, ("max_prompt_tokens",))
    if self.text.encoder_width != self.vision.hidden_size:
      raise UserError(f"the text encoder's encoder_width={self.text.encoder_width} must be the ViT's "
                      f"hidden_size={self.vision.hidden_size}")
    if self.max_prompt_tokens > self.text.max_position_embeddings:
      raise UserError(f"max_prompt_tokens={self.max_prompt_tokens} exceeds the text encoder's "
                      f"max_position_embeddings={self.text.max_position_embeddings}")
    if not self.std > 0:
      raise UserError(f"ImageRewardConfig.std={self.std!r} must be positive")

  @classmethod
  def from_hf(cls, d: dict, **overrides) -> "ImageRewardConfig":
    """From the config.json `python -m checkpoints_convert.image_reward` writes."""
    if not isinstance(d, dict) or d.get("model_type") != MODEL_TYPE:
      raise UserError(f"model_type={d.get('model_type') if isinstance(d, dict) else d!r}, expected "
                      f"{MODEL_TYPE!r} (a folder written by python -m checkpoints_convert.image_reward)")
    bad = sorted(set(overrides) - set(cls.RUNTIME))
    if bad:
      raise ValueError(f"overrides {bad} are not runtime fields {cls.RUNTIME}")
    known = {f.name for f in dataclasses.fields(cls)} - set(cls.RUNTIME)
    unknown = sorted(set(d) - known - {"model_type"})
    if unknown:
      raise UserError(f"image_reward config: unknown key(s) {unknown}")
    values = {k: v for k, v in d.items() if k in known}
    for name, sub in (("vision", BlipVisionConfig), ("text", BlipTextConfig)):
      try:
        values[name] = sub(**d.get(name, {}))
      except TypeError as e:  # an unknown field
        raise UserError(f"image_reward config {name!r}: {e}") from None
    return cls(**values, **overrides)

  def to_hf(self) -> dict:
    return {**self.HF_FIXED, "vision": dataclasses.asdict(self.vision), "text": dataclasses.asdict(self.text),
            "head_hidden": list(self.head_hidden), "mean": self.mean, "std": self.std,
            "max_prompt_tokens": self.max_prompt_tokens}

  @classmethod
  def full(cls, **overrides) -> "ImageRewardConfig":
    """The released ImageReward (`ImageReward-v1.0`)."""
    return cls(**overrides)
