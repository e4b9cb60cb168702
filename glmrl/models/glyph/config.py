"""Config of the ByT5 glyph encoder (transformers `T5EncoderModel`, `text_encoder/config.json`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from glmrl.errors import UserError
from glmrl.models.config_fields import HFConfig

# Activation names transformers' ACT2FN accepts here. "gated-gelu" means the tanh-approximate
# GELU ("gelu_new"), a T5 v1.1 convention kept by transformers for compatibility.
ACTIVATIONS = ("relu", "gelu", "gelu_new", "silu")


@dataclasses.dataclass(frozen=True)
class T5EncoderConfig(HFConfig):
  # T5Config's own defaults for keys a config.json leaves out.
  HF_DEFAULTS = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                     relative_attention_num_buckets=32, relative_attention_max_distance=128, layer_norm_epsilon=1e-6,
                     feed_forward_proj="relu", pad_token_id=0, eos_token_id=1)
  HF_FIXED = {"architectures": ["T5EncoderModel"], "model_type": "t5", "is_encoder_decoder": False,
              "use_cache": False, "tie_word_embeddings": False, "tokenizer_class": "ByT5Tokenizer"}
  RUNTIME = ("dtype", "param_dtype")
  vocab_size: int = 384
  d_model: int = 1472
  d_kv: int = 64
  d_ff: int = 3584
  num_layers: int = 12
  num_heads: int = 6
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  feed_forward_proj: str = "gated-gelu"
  pad_token_id: int = 0
  eos_token_id: int = 1
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    parts = self.feed_forward_proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or parts[-1] not in ACTIVATIONS:
      raise UserError(f"feed_forward_proj={self.feed_forward_proj!r} is not supported "
                      f"(expected '<act>' or 'gated-<act>' with act in {ACTIVATIONS})")
    for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                 "relative_attention_num_buckets", "relative_attention_max_distance"):
      if getattr(self, name) < 1:
        raise UserError(f"{name}={getattr(self, name)} must be >= 1")

  @property
  def is_gated(self) -> bool:
    return self.feed_forward_proj.startswith("gated-")

  @property
  def activation(self) -> str:
    if self.feed_forward_proj == "gated-gelu":
      return "gelu_new"
    return self.feed_forward_proj.split("-")[-1]

  @classmethod
  def full(cls, **overrides) -> "T5EncoderConfig":
    """google/byt5-small's encoder (d_model 1472 = the DiT's text_embed_dim). The released
    text_encoder/config.json was not available; see the package docstring."""
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides) -> "T5EncoderConfig":
    kw = dict(vocab_size=384, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
              relative_attention_num_buckets=8, relative_attention_max_distance=20)
    kw.update(overrides)
    return cls(**kw)

  def to_hf(self) -> dict[str, Any]:
    return {**super().to_hf(), "decoder_start_token_id": self.pad_token_id}
