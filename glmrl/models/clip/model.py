"""CLIP (transformers `CLIPModel`) in Flax NNX: causal text tower, ViT image tower, projections.

`text_features` / `image_features` are `get_text_features` / `get_image_features` (projected, not
normalised); `__call__` adds the normalised embeddings and `logits_per_image` =
exp(logit_scale) * cosine similarity, like `CLIPModel.forward`. Images enter as NHWC float arrays
already preprocessed (`glmrl.models.clip.preprocess`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.clip.config import LEGACY_EOS_TOKEN_ID, ClipConfig
from glmrl.models.clip.encoder import EncoderLayer, layer_norm, linear
from glmrl.sharding import CONV_IN, EMBED, VOCAB


class ClipOutput(NamedTuple):
  image_embeds: jax.Array      # [B, P] unit norm, float32
  text_embeds: jax.Array       # [T, P] unit norm, float32
  logits_per_image: jax.Array  # [B, T] exp(logit_scale) * cosine


def l2_normalize(x_BxE: jax.Array) -> jax.Array:
  x_BxE = x_BxE.astype(jnp.float32)
  return x_BxE / jnp.sqrt(jnp.sum(jnp.square(x_BxE), axis=-1, keepdims=True))


class TextTower(nnx.Module):
  """Token + learned position embeddings, causal pre-norm layers, final LayerNorm, end-token pooling."""

  def __init__(self, cfg: ClipConfig, *, rngs: nnx.Rngs):
    t = cfg.text
    self.cfg = t
    self.token_embedding = nnx.Embed(t.vocab_size, t.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                     embedding_init=nnx.initializers.normal(0.02), rngs=rngs,
                                     embedding_metadata={"out_sharding": (VOCAB, EMBED)})
    self.position_embedding = nnx.Param(
        nnx.initializers.normal(0.02)(rngs.params(), (t.max_position_embeddings, t.hidden_size), cfg.param_dtype),
        out_sharding=(None, EMBED))
    self.layers = nnx.List([EncoderLayer(cfg, t, rngs=rngs) for _ in range(t.num_hidden_layers)])
    self.final_norm = layer_norm(cfg, t.hidden_size, t.layer_norm_eps, rngs=rngs)

  def __call__(self, input_ids_BxL, attention_mask_BxL=None):
    """(last_hidden_state [B, L, D], pooled [B, D]) of int ids [B, L] (right-padded)."""
    t = self.cfg
    if input_ids_BxL.ndim != 2:
      raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids_BxL.shape)}")
    b, l = input_ids_BxL.shape
    if l > t.max_position_embeddings:
      raise ValueError(f"input_ids length {l} exceeds max_position_embeddings={t.max_position_embeddings}")
    causal_LxS = jnp.tril(jnp.ones((l, l), jnp.bool_))
    mask_Bx1xLxS = jnp.broadcast_to(causal_LxS, (b, 1, l, l))
    if attention_mask_BxL is not None:
      if tuple(attention_mask_BxL.shape) != (b, l):
        raise ValueError(f"attention_mask shape {tuple(attention_mask_BxL.shape)} != input_ids shape {(b, l)}")
      mask_Bx1xLxS = mask_Bx1xLxS & (attention_mask_BxL != 0)[:, None, None, :]
    x_BxLxD = self.token_embedding(input_ids_BxL) + self.position_embedding[:l].astype(self.token_embedding.dtype)
    for layer in self.layers:
      x_BxLxD = layer(x_BxLxD, mask_Bx1xLxS)
    x_BxLxD = self.final_norm(x_BxLxD)
    if t.eos_token_id == LEGACY_EOS_TOKEN_ID:
      end_B = jnp.argmax(input_ids_BxL, axis=-1)
    else:
      # First end token; a row without one pools position 0, as the reference's argmax does.
      end_B = jnp.argmax((input_ids_BxL == t.eos_token_id).astype(jnp.int32), axis=-1)
    pooled_BxD = jnp.take_along_axis(x_BxLxD, end_B[:, None, None], axis=1)[:, 0]
    return x_BxLxD, pooled_BxD


class VisionTower(nnx.Module):
  """Patch embedding, class token, learned positions, pre/post LayerNorms, class-token pooling."""

  def __init__(self, cfg: ClipConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.cfg = v
    p = v.patch_size
    self.patch_embedding = nnx.Conv(v.num_channels, v.hidden_size, (p, p), strides=(p, p), padding="VALID",
                                    use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                                    kernel_metadata={"out_sharding": (None, None, CONV_IN, EMBED)})
    self.class_embedding = nnx.Param(
        nnx.initializers.normal(v.hidden_size ** -0.5)(rngs.params(), (v.hidden_size,), cfg.param_dtype),
        out_sharding=(EMBED,))
    self.position_embedding = nnx.Param(
        nnx.initializers.normal(0.02)(rngs.params(), (v.num_positions, v.hidden_size), cfg.param_dtype),
        out_sharding=(None, EMBED))
    self.pre_norm = layer_norm(cfg, v.hidden_size, v.layer_norm_eps, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(cfg, v, rngs=rngs) for _ in range(v.num_hidden_layers)])
    self.post_norm = layer_norm(cfg, v.hidden_size, v.layer_norm_eps, rngs=rngs)

  def __call__(self, pixel_values_BxhxwxC):
    """(last_hidden_state [B, 1 + N, D], pooled [B, D]) of preprocessed NHWC images."""
    v = self.cfg
    want = (v.image_size, v.image_size, v.num_channels)
    if pixel_values_BxhxwxC.ndim != 4 or tuple(pixel_values_BxhxwxC.shape[1:]) != want:
      raise ValueError(f"pixel_values must be [B, {v.image_size}, {v.image_size}, {v.num_channels}] (NHWC), "
                       f"got shape {tuple(pixel_values_BxhxwxC.shape)}")
    b = pixel_values_BxhxwxC.shape[0]
    patches_BxhxwxD = self.patch_embedding(pixel_values_BxhxwxC)
    patches_BxXxD = patches_BxhxwxD.reshape(b, v.grid ** 2, v.hidden_size)
    cls_Bx1xD = jnp.broadcast_to(self.class_embedding[...].astype(patches_BxXxD.dtype), (b, 1, v.hidden_size))
    x_BxTxD = jnp.concatenate([cls_Bx1xD, patches_BxXxD], axis=1)
    x_BxTxD = self.pre_norm(x_BxTxD + self.position_embedding[...].astype(x_BxTxD.dtype))
    for layer in self.layers:
      x_BxTxD = layer(x_BxTxD)
    return x_BxTxD, self.post_norm(x_BxTxD[:, 0])


class ClipModel(nnx.Module):
  """Both towers, the bias-free projections into the shared space, and the learned logit scale."""

  def __init__(self, cfg: ClipConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.text = TextTower(cfg, rngs=rngs)
    self.vision = VisionTower(cfg, rngs=rngs)
    self.text_projection = linear(cfg, cfg.text.hidden_size, cfg.projection_dim, (EMBED, None),
                                  use_bias=False, rngs=rngs)
    self.visual_projection = linear(cfg, cfg.vision.hidden_size, cfg.projection_dim, (EMBED, None),
                                    use_bias=False, rngs=rngs)
    self.logit_scale = nnx.Param(jnp.asarray(cfg.logit_scale_init_value, cfg.param_dtype), out_sharding=())

  def text_features(self, input_ids_BxL, attention_mask_BxL=None):
    """Projected pooled text features [B, P] (not normalised)."""
    return self.text_projection(self.text(input_ids_BxL, attention_mask_BxL)[1])

  def image_features(self, pixel_values_BxhxwxC):
    """Projected pooled image features [B, P] (not normalised)."""
    return self.visual_projection(self.vision(pixel_values_BxhxwxC)[1])

  def __call__(self, pixel_values_BxhxwxC, input_ids_BxL, attention_mask_BxL=None) -> ClipOutput:
    image_BxE = l2_normalize(self.image_features(pixel_values_BxhxwxC))
    text_BxE = l2_normalize(self.text_features(input_ids_BxL, attention_mask_BxL))
    scale = jnp.exp(self.logit_scale[...].astype(jnp.float32))
    return ClipOutput(image_BxE, text_BxE, scale * jnp.einsum("bp,tp->bt", image_BxE, text_BxE))
