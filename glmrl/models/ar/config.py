"""Configuration of the GLM-Image AR generator (transformers `GlmImageForConditionalGeneration`).

Field names follow transformers' `GlmImageConfig` and its three sub-configs so that
`from_hf` / `to_hf` are plain renames; the M-RoPE settings that HF keeps in the
`rope_parameters` dict are flattened into `TextConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from glmrl.errors import UserError
from glmrl.models.config_fields import HFConfig, check_positive_ints, known_fields

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
}

# The released checkpoint's rotary settings. transformers' GlmImageTextConfig() defaults
# omit partial_rotary_factor / mrope_section, which config.json sets explicitly.
_RELEASED_ROPE = dict(rope_theta=10000.0, partial_rotary_factor=0.5, mrope_section=(8, 12, 12))


@dataclasses.dataclass(frozen=True)
class TextConfig:
  """The GLM-4 decoder (`text_config`)."""
  vocab_size: int = 168064
  vision_vocab_size: int = 16512
  hidden_size: int = 4096
  intermediate_size: int = 13696
  num_hidden_layers: int = 40
  num_attention_heads: int = 32
  num_key_value_heads: int = 2
  hidden_act: str = "silu"
  max_position_embeddings: int = 131072
  rms_norm_eps: float = 1e-5
  attention_bias: bool = True
  rope_theta: float = _RELEASED_ROPE["rope_theta"]
  partial_rotary_factor: float = _RELEASED_ROPE["partial_rotary_factor"]
  mrope_section: tuple[int, ...] = _RELEASED_ROPE["mrope_section"]
  pad_token_id: int = 167841
  eos_token_id: int = 16385

  def __post_init__(self):
    check_positive_ints(self, ("vocab_size", "vision_vocab_size", "hidden_size", "intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "num_key_value_heads"))
    object.__setattr__(self, "mrope_section", tuple(int(s) for s in self.mrope_section))
    if self.hidden_size % self.num_attention_heads:
      raise UserError(f"TextConfig.hidden_size={self.hidden_size} is not divisible by "
                      f"num_attention_heads={self.num_attention_heads}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise UserError(f"TextConfig.num_attention_heads={self.num_attention_heads} is not divisible by "
                      f"num_key_value_heads={self.num_key_value_heads}")
    if self.vision_vocab_size > self.vocab_size:
      raise UserError(f"TextConfig.vision_vocab_size={self.vision_vocab_size} exceeds vocab_size={self.vocab_size}")
    if self.hidden_act not in ACTIVATIONS:
      raise UserError(f"TextConfig.hidden_act={self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
    if self.rotary_dim % 2 or self.rotary_dim <= 0:
      raise UserError(f"TextConfig.partial_rotary_factor={self.partial_rotary_factor} gives rotary dim "
                      f"{self.rotary_dim} of head_dim {self.head_dim}; it must be a positive even number")
    # Each frequency of the rotated half belongs to exactly one of the temporal/height/width sections.
    if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.rotary_dim // 2:
      raise UserError(f"TextConfig.mrope_section={self.mrope_section} must be 3 sizes summing to "
                      f"rotary_dim // 2 = {self.rotary_dim // 2}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def rotary_dim(self) -> int:
    return int(self.head_dim * self.partial_rotary_factor)

  @classmethod
  def from_hf(cls, d: dict) -> "TextConfig":
    values = known_fields(cls, d)
    for k in ("rope_theta", "partial_rotary_factor", "mrope_section"):
      values.pop(k, None)
    # transformers 5 keeps the rotary settings in `rope_parameters`; older configs in `rope_scaling`
    # (mrope_section, type) next to top-level rope_theta / partial_rotary_factor.
    rope = dict(d.get("rope_scaling") or {})
    rope.update({k: d[k] for k in ("rope_theta", "partial_rotary_factor") if k in d})
    rope.update(d.get("rope_parameters") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
      raise UserError(f"rope_type={rope_type!r} is not supported (only 'default' M-RoPE)")
    if d.get("num_key_value_heads") is None:
      values["num_key_value_heads"] = d.get("num_attention_heads", cls.num_attention_heads)
    if isinstance(values.get("eos_token_id"), (list, tuple)):
      raise UserError(f"eos_token_id={values['eos_token_id']!r}: a single id is expected")
    return cls(**values,
               rope_theta=float(rope.get("rope_theta", 10000.0)),
               partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)),
               mrope_section=tuple(rope.get("mrope_section", (8, 12, 12))))

  def to_hf(self) -> dict:
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    for k in ("rope_theta", "partial_rotary_factor", "mrope_section"):
      d.pop(k)
    d["rope_parameters"] = dict(rope_type="default", rope_theta=self.rope_theta,
                                partial_rotary_factor=self.partial_rotary_factor,
                                mrope_section=list(self.mrope_section))
    return d


@dataclasses.dataclass(frozen=True)
class VisionConfig(HFConfig):
  """The ViT that encodes condition images (`vision_config`)."""
  depth: int = 40
  hidden_size: int = 1536
  hidden_act: str = "gelu"
  attention_bias: bool = True
  num_heads: int = 16
  in_channels: int = 3
  image_size: int = 2048
  patch_size: int = 16
  spatial_merge_size: int = 1
  intermediate_size: int = 6144
  layer_norm_eps: float = 1e-6

  def __post_init__(self):
    check_positive_ints(self, ("depth", "hidden_size", "num_heads", "in_channels", "image_size",
                          "patch_size", "spatial_merge_size", "intermediate_size"))
    if self.hidden_size % self.num_heads:
      raise UserError(f"VisionConfig.hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
    if self.image_size % self.patch_size:
      raise UserError(f"VisionConfig.image_size={self.image_size} is not divisible by patch_size={self.patch_size}")
    if self.hidden_act not in ACTIVATIONS:
      raise UserError(f"VisionConfig.hidden_act={self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
    # The encoder has no patch merger: each patch is one VQ token, in raster order.
    if self.spatial_merge_size != 1:
      raise UserError(f"VisionConfig.spatial_merge_size={self.spatial_merge_size}: only 1 is supported")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Width of one packed patch row of `pixel_values`: channels x patch x patch."""
    return self.in_channels * self.patch_size * self.patch_size

  @property
  def pos_grid(self) -> int:
    """Side of the square learned position-embedding grid."""
    return self.image_size // self.patch_size

  @classmethod
  def from_hf(cls, d: dict, **overrides) -> "VisionConfig":
    for k in ("image_size", "patch_size"):
      if isinstance(d.get(k), (list, tuple)):
        raise UserError(f"VisionConfig.{k}={d[k]!r}: only a single int is supported")
    return super().from_hf(d, **overrides)


@dataclasses.dataclass(frozen=True)
class VQConfig(HFConfig):
  """The vector quantizer that turns vision features into codebook ids (`vq_config`)."""
  embed_dim: int = 2048
  num_embeddings: int = 16384
  latent_channels: int = 1536
  in_channels: int = 3

  def __post_init__(self):
    check_positive_ints(self, ("embed_dim", "num_embeddings", "latent_channels", "in_channels"))



@dataclasses.dataclass(frozen=True)
class ARConfig:
  """The whole generator plus runtime options.

  `dtype`: compute dtype; `param_dtype`: parameter dtype; `remat`: rematerialise each
  decoder layer in the backward pass of the teacher-forcing forward. The runtime options
  are not part of the HF config.
  """
  text: TextConfig = TextConfig()
  vision: VisionConfig = VisionConfig()
  vq: VQConfig = VQConfig()
  image_token_id: int = 167855
  image_start_token_id: int = 16384
  image_end_token_id: int = 16385
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  remat: bool = False

  def __post_init__(self):
    t = self.text
    if self.vq.latent_channels != self.vision.hidden_size:
      raise UserError(f"VQConfig.latent_channels={self.vq.latent_channels} must equal the vision "
                      f"hidden_size={self.vision.hidden_size} (the quantizer reads the encoder output)")
    if self.vq.num_embeddings > t.vision_vocab_size:
      raise UserError(f"VQConfig.num_embeddings={self.vq.num_embeddings} exceeds "
                      f"text vision_vocab_size={t.vision_vocab_size}")
    for name in ("image_token_id", "image_start_token_id", "image_end_token_id"):
      value = getattr(self, name)
      if not 0 <= value < t.vocab_size:
        raise UserError(f"ARConfig.{name}={value} is outside the vocabulary [0, {t.vocab_size})")
    # The sampler feeds sampled lm_head ids straight back as input ids, so the start/end
    # markers must be inside the vision vocabulary, above the codebook ids.
    for name in ("image_start_token_id", "image_end_token_id"):
      value = getattr(self, name)
      if not self.vq.num_embeddings <= value < t.vision_vocab_size:
        raise UserError(f"ARConfig.{name}={value} must lie in [{self.vq.num_embeddings}, {t.vision_vocab_size})")

  @classmethod
  def from_hf(cls, config_dict: dict, **overrides) -> "ARConfig":
    """From `vision_language_encoder/config.json` as a dict; `overrides` set runtime fields."""
    if not isinstance(config_dict, dict):
      raise UserError(f"config_dict must be a dict, got {type(config_dict).__name__}")
    model_type = config_dict.get("model_type", "glm_image")
    if model_type != "glm_image":
      raise UserError(f"model_type={model_type!r}, expected 'glm_image'")
    bad = sorted(set(overrides) - {"dtype", "param_dtype", "remat"})
    if bad:
      raise ValueError(f"overrides {bad} are not runtime fields (dtype, param_dtype, remat)")
    ids = {k: config_dict[k] for k in ("image_token_id", "image_start_token_id", "image_end_token_id")
           if k in config_dict}
    return cls(text=TextConfig.from_hf(config_dict.get("text_config") or {}),
               vision=VisionConfig.from_hf(config_dict.get("vision_config") or {}),
               vq=VQConfig.from_hf(config_dict.get("vq_config") or {}),
               **ids, **overrides)

  def to_hf(self) -> dict:
    """A dict that `transformers.GlmImageConfig(**d)` accepts."""
    return dict(model_type="glm_image", text_config=self.text.to_hf(), vision_config=self.vision.to_hf(),
                vq_config=self.vq.to_hf(), image_token_id=self.image_token_id,
                image_start_token_id=self.image_start_token_id, image_end_token_id=self.image_end_token_id,
                tie_word_embeddings=False)

  @classmethod
  def full(cls, **overrides) -> "ARConfig":
    """The released generator (10,114,245,632 parameters)."""
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides) -> "ARConfig":
    """A small model for tests; the id layout mirrors the released one (codebook, markers, text)."""
    text = TextConfig(vocab_size=160, vision_vocab_size=80, hidden_size=128, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, rope_theta=10000.0, partial_rotary_factor=0.5,
                      mrope_section=(2, 3, 3), pad_token_id=150, eos_token_id=65)
    vision = VisionConfig(depth=2, hidden_size=32, num_heads=2, in_channels=3, image_size=32, patch_size=4,
                          intermediate_size=64)
    vq = VQConfig(embed_dim=24, num_embeddings=64, latent_channels=32, in_channels=3)
    values = dict(text=text, vision=vision, vq=vq, image_token_id=155, image_start_token_id=64,
                  image_end_token_id=65)
    values.update(overrides)
    return cls(**values)
