"""Key map of `vision_language_encoder/` (transformers GlmImageForConditionalGeneration) <-> `GlmImageAR`.

Fused torch projections ([n*out, in] weights: vision qkv, text gate_up) become Flax
kernels [in, n, out] and biases [n, out], so that sharding `out` keeps the n members aligned.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from checkpoints_convert.rules import CONV2D, IDENTITY, TRANSPOSE, Rule


@dataclasses.dataclass(frozen=True)
class StackedKernel:
  """torch weight [n*out, in] <-> kernel [in, n, out]."""
  n: int

  def to_flax(self, a: np.ndarray) -> np.ndarray:
    out = a.shape[0] // self.n
    return np.ascontiguousarray(np.reshape(a, (self.n, out, a.shape[1])).transpose(2, 0, 1))

  def to_hf(self, a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(a, (1, 2, 0))).reshape(a.shape[1] * a.shape[2], a.shape[0])

  def flax_shape(self, hf_shape: Sequence[int]) -> tuple[int, ...]:
    if len(hf_shape) != 2 or hf_shape[0] % self.n:
      raise ValueError(f"expected [{self.n}*out, in] for a stacked kernel, got {tuple(hf_shape)}")
    return (int(hf_shape[1]), self.n, int(hf_shape[0]) // self.n)

  def hf_shape(self, flax_shape: Sequence[int]) -> tuple[int, ...]:
    if len(flax_shape) != 3 or flax_shape[1] != self.n:
      raise ValueError(f"expected [in, {self.n}, out] for a stacked kernel, got {tuple(flax_shape)}")
    return (self.n * int(flax_shape[2]), int(flax_shape[0]))


@dataclasses.dataclass(frozen=True)
class StackedBias:
  """torch bias [n*out] <-> bias [n, out]."""
  n: int

  def to_flax(self, a: np.ndarray) -> np.ndarray:
    return np.reshape(a, (self.n, a.shape[0] // self.n))

  def to_hf(self, a: np.ndarray) -> np.ndarray:
    return np.reshape(a, (a.shape[0] * a.shape[1],))

  def flax_shape(self, hf_shape: Sequence[int]) -> tuple[int, ...]:
    if len(hf_shape) != 1 or hf_shape[0] % self.n:
      raise ValueError(f"expected [{self.n}*out] for a stacked bias, got {tuple(hf_shape)}")
    return (self.n, int(hf_shape[0]) // self.n)

  def hf_shape(self, flax_shape: Sequence[int]) -> tuple[int, ...]:
    if len(flax_shape) != 2 or flax_shape[0] != self.n:
      raise ValueError(f"expected [{self.n}, out] for a stacked bias, got {tuple(flax_shape)}")
    return (self.n * int(flax_shape[1]),)


def _linear(hf: str, flax: str) -> tuple[Rule, Rule]:
  return Rule(f"{hf}.weight", f"{flax}.kernel", TRANSPOSE), Rule(f"{hf}.bias", f"{flax}.bias", IDENTITY)


def _conv(hf: str, flax: str) -> tuple[Rule, Rule]:
  return Rule(f"{hf}.weight", f"{flax}.kernel", CONV2D), Rule(f"{hf}.bias", f"{flax}.bias", IDENTITY)


def _layer_norm(hf: str, flax: str) -> tuple[Rule, Rule]:
  return Rule(f"{hf}.weight", f"{flax}.scale", IDENTITY), Rule(f"{hf}.bias", f"{flax}.bias", IDENTITY)


_VIS = "model.visual"
_BLOCK_HF, _BLOCK = f"{_VIS}.blocks.{{i}}", "visual.blocks.{i}"
_LAYER_HF, _LAYER = "model.language_model.layers.{i}", "text.layers.{i}"
_VQ = "model.vqmodel"

RULES = (
    # Vision encoder.
    *_conv(f"{_VIS}.patch_embed.proj", "visual.patch_embed"),
    Rule(f"{_VIS}.embeddings.position_embedding.weight", "visual.pos_embed.embedding", IDENTITY),
    *_layer_norm(f"{_BLOCK_HF}.norm1", f"{_BLOCK}.norm1"),
    *_layer_norm(f"{_BLOCK_HF}.norm2", f"{_BLOCK}.norm2"),
    Rule(f"{_BLOCK_HF}.attn.qkv.weight", f"{_BLOCK}.attn.qkv.kernel", StackedKernel(3)),
    Rule(f"{_BLOCK_HF}.attn.qkv.bias", f"{_BLOCK}.attn.qkv.bias", StackedBias(3)),
    *_linear(f"{_BLOCK_HF}.attn.proj", f"{_BLOCK}.attn.proj"),
    *_linear(f"{_BLOCK_HF}.mlp.fc1", f"{_BLOCK}.mlp.fc1"),
    *_linear(f"{_BLOCK_HF}.mlp.fc2", f"{_BLOCK}.mlp.fc2"),
    # Vector quantizer.
    *_conv(f"{_VQ}.quant_conv", "vq.quant_conv"),
    *_conv(f"{_VQ}.post_quant_conv", "vq.post_quant_conv"),
    Rule(f"{_VQ}.quantize.embedding.weight", "vq.codebook.embedding", IDENTITY),
    # Text decoder.
    Rule("model.language_model.embed_tokens.weight", "text.embed.embedding", IDENTITY),
    *_linear(f"{_LAYER_HF}.self_attn.q_proj", f"{_LAYER}.attn.q"),
    *_linear(f"{_LAYER_HF}.self_attn.k_proj", f"{_LAYER}.attn.k"),
    *_linear(f"{_LAYER_HF}.self_attn.v_proj", f"{_LAYER}.attn.v"),
    Rule(f"{_LAYER_HF}.self_attn.o_proj.weight", f"{_LAYER}.attn.o.kernel", TRANSPOSE),
    Rule(f"{_LAYER_HF}.mlp.gate_up_proj.weight", f"{_LAYER}.mlp.gate_up.kernel", StackedKernel(2)),
    Rule(f"{_LAYER_HF}.mlp.down_proj.weight", f"{_LAYER}.mlp.down.kernel", TRANSPOSE),
    *(Rule(f"{_LAYER_HF}.{name}.weight", f"{_LAYER}.{name}.scale", IDENTITY)
      for name in ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
                   "post_mlp_layernorm")),
    Rule("model.language_model.norm.weight", "text.norm.scale", IDENTITY),
    Rule("lm_head.weight", "lm_head.kernel", TRANSPOSE),
)
