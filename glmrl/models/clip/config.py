"""Configuration of CLIP (transformers `CLIPModel`, its `config.json`).

Field names follow transformers' `CLIPTextConfig` / `CLIPVisionConfig` / `CLIPConfig`, so `from_hf` /
`to_hf` are plain renames. The two released layouts the rewards use differ only in sizes and the MLP
activation: `openai/clip-vit-large-patch14` (`ClipConfig.full()`, QuickGELU, 768-d projection) and the
OpenCLIP ViT-H/14 that PickScore fine-tunes (`ClipConfig.vit_h14()`, exact GELU, 1024-d projection).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from glmrl.errors import UserError
from glmrl.models.config_fields import HFConfig, check_positive_ints

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    # OpenAI's CLIP was trained with the sigmoid approximation x * sigmoid(1.702 x).
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}

# Before transformers PR #24773 CLIP configs stored eos_token_id=2 and pooled the text at the
# argmax token id (the real end-of-text id is the largest in the vocabulary); newer configs pool at
# the first eos_token_id. Both released checkpoints still carry 2.
LEGACY_EOS_TOKEN_ID = 2


def _sub_config(d: dict, key: str) -> dict:
  """A sub-config dict; a legacy `<key>_dict` entry wins over `<key>`, as in transformers."""
  legacy = d.get(key + "_dict")
  if legacy is not None:
    return dict(legacy)
  return dict(d.get(key) or {})


@dataclasses.dataclass(frozen=True)
class ClipTextConfig(HFConfig):
  """The causal text transformer (`text_config`); defaults are openai/clip-vit-large-patch14's."""
  # transformers' CLIPTextConfig defaults for keys a config.json leaves out.
  HF_DEFAULTS = dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                     num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                     pad_token_id=1, bos_token_id=49406, eos_token_id=49407)
  vocab_size: int = 49408
  hidden_size: int = 768
  intermediate_size: int = 3072
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  max_position_embeddings: int = 77
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5
  pad_token_id: int = 1
  bos_token_id: int = 0
  eos_token_id: int = LEGACY_EOS_TOKEN_ID

  def __post_init__(self):
    check_positive_ints(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "max_position_embeddings"))
    if self.hidden_size % self.num_attention_heads:
      raise UserError(f"ClipTextConfig.hidden_size={self.hidden_size} is not divisible by "
                      f"num_attention_heads={self.num_attention_heads}")
    if self.hidden_act not in ACTIVATIONS:
      raise UserError(f"ClipTextConfig.hidden_act={self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
    if isinstance(self.eos_token_id, (list, tuple)):
      raise UserError(f"ClipTextConfig.eos_token_id={self.eos_token_id!r}: a single id is expected")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads


@dataclasses.dataclass(frozen=True)
class ClipVisionConfig(HFConfig):
  """The ViT image tower (`vision_config`); defaults are openai/clip-vit-large-patch14's."""
  # transformers' CLIPVisionConfig defaults for keys a config.json leaves out.
  HF_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                     num_channels=3, image_size=224, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5)
  hidden_size: int = 1024
  intermediate_size: int = 4096
  num_hidden_layers: int = 24
  num_attention_heads: int = 16
  num_channels: int = 3
  image_size: int = 224
  patch_size: int = 14
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5

  def __post_init__(self):
    for name in ("image_size", "patch_size"):
      if isinstance(getattr(self, name), (list, tuple)):
        raise UserError(f"ClipVisionConfig.{name}={getattr(self, name)!r}: only a single int is supported")
    check_positive_ints(self, ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "num_channels", "image_size", "patch_size"))
    if self.hidden_size % self.num_attention_heads:
      raise UserError(f"ClipVisionConfig.hidden_size={self.hidden_size} is not divisible by "
                      f"num_attention_heads={self.num_attention_heads}")
    if self.patch_size > self.image_size:
      raise UserError(f"ClipVisionConfig.patch_size={self.patch_size} exceeds image_size={self.image_size}")
    if self.hidden_act not in ACTIVATIONS:
      raise UserError(f"ClipVisionConfig.hidden_act={self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def grid(self) -> int:
    """Patches per side (a stride-patch convolution drops any remainder)."""
    return self.image_size // self.patch_size

  @property
  def num_positions(self) -> int:
    """Patches plus the class token."""
    return self.grid ** 2 + 1


@dataclasses.dataclass(frozen=True)
class ClipConfig:
  """Both towers, their projections, and the runtime dtypes (not part of the HF config)."""
  text: ClipTextConfig = ClipTextConfig()
  vision: ClipVisionConfig = ClipVisionConfig()
  projection_dim: int = 768
  logit_scale_init_value: float = 2.6592
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    check_positive_ints(self, ("projection_dim",))

  @classmethod
  def from_hf(cls, config_dict: dict, **overrides) -> "ClipConfig":
    """From a `CLIPModel` config.json as a dict; `overrides` set dtype / param_dtype."""
    if not isinstance(config_dict, dict):
      raise UserError(f"config_dict must be a dict, got {type(config_dict).__name__}")
    model_type = config_dict.get("model_type", "clip")
    if model_type != "clip":
      raise UserError(f"model_type={model_type!r}, expected 'clip' (a transformers CLIPModel config)")
    bad = sorted(set(overrides) - {"dtype", "param_dtype"})
    if bad:
      raise ValueError(f"overrides {bad} are not runtime fields (dtype, param_dtype)")
    top = {k: config_dict[k] for k in ("projection_dim", "logit_scale_init_value")
           if config_dict.get(k) is not None}
    return cls(text=ClipTextConfig.from_hf(_sub_config(config_dict, "text_config")),
               vision=ClipVisionConfig.from_hf(_sub_config(config_dict, "vision_config")),
               **{"projection_dim": 512, **top}, **overrides)

  def to_hf(self) -> dict:
    """A dict that `transformers.CLIPConfig(**d)` accepts."""
    return dict(model_type="clip", architectures=["CLIPModel"], text_config=self.text.to_hf(),
                vision_config=self.vision.to_hf(), projection_dim=self.projection_dim,
                logit_scale_init_value=self.logit_scale_init_value)

  @classmethod
  def full(cls, **overrides) -> "ClipConfig":
    """openai/clip-vit-large-patch14 (CLIP score, LAION aesthetic predictor): 427,616,513 parameters."""
    return cls(**overrides)

  @classmethod
  def vit_h14(cls, **overrides) -> "ClipConfig":
    """The OpenCLIP ViT-H/14 layout of laion/CLIP-ViT-H-14-laion2B-s32B-b79K and PickScore_v1."""
    values = dict(
        text=ClipTextConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                            num_attention_heads=16, hidden_act="gelu"),
        vision=ClipVisionConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                                num_attention_heads=16, hidden_act="gelu"),
        projection_dim=1024)
    values.update(overrides)
    return cls(**values)

  @classmethod
  def tiny(cls, **overrides) -> "ClipConfig":
    """A small model for tests (both towers two layers deep, 32x32 images in 8x8 patches)."""
    values = dict(
        text=ClipTextConfig(vocab_size=600, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=16),
        vision=ClipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, image_size=32, patch_size=8),
        projection_dim=16)
    values.update(overrides)
    return cls(**values)
