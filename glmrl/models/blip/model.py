"""ImageReward in Flax NNX: BLIP's ViT, BLIP's BERT text encoder cross-attending to it, the preference MLP.

score = (mlp(text_encoder(prompt ids, image tokens)[:, 0]) - mean) / std, as `ImageReward.score` computes it:
the prompt's first token ([CLS]) after every layer has attended to the prompt and to all of the ViT's tokens.
Images enter as NHWC float arrays already preprocessed (`glmrl.models.clip.preprocess`: CLIP's shortest-side
bicubic resize, centre crop and OpenAI's mean and std are ImageReward's transform too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.blip.config import BlipTextConfig, ImageRewardConfig
from glmrl.models.clip.aesthetic import AestheticConfig, AestheticHead
from glmrl.models.clip.config import ACTIVATIONS
from glmrl.models.clip.encoder import EncoderLayer, attend, layer_norm, linear
from glmrl.sharding import CONV_IN, EMBED, HEADS, KV, MLP, VOCAB


class BlipVision(nnx.Module):
  """Patch embedding (a biased convolution), class token, learned positions, pre-norm layers (CLIP's), final
  LayerNorm over every token (what the text encoder attends to)."""

  def __init__(self, cfg: ImageRewardConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.cfg = v
    p = v.patch_size
    self.patch_embedding = nnx.Conv(v.num_channels, v.hidden_size, (p, p), strides=(p, p), padding="VALID",
                                    dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                                    kernel_metadata={"out_sharding": (None, None, CONV_IN, EMBED)},
                                    bias_metadata={"out_sharding": (EMBED,)})
    init = nnx.initializers.truncated_normal(0.02)
    self.class_embedding = nnx.Param(init(rngs.params(), (v.hidden_size,), cfg.param_dtype), out_sharding=(EMBED,))
    self.position_embedding = nnx.Param(init(rngs.params(), (v.num_positions, v.hidden_size), cfg.param_dtype),
                                        out_sharding=(None, EMBED))
    self.layers = nnx.List([EncoderLayer(cfg, v, rngs=rngs) for _ in range(v.num_hidden_layers)])
    self.final_norm = layer_norm(cfg, v.hidden_size, v.layer_norm_eps, rngs=rngs)

  def __call__(self, pixel_values_BxhxwxC) -> jax.Array:
    """The image's tokens [B, 1 + N, D] (class token first), normalised."""
    v = self.cfg
    want = (v.image_size, v.image_size, v.num_channels)
    if pixel_values_BxhxwxC.ndim != 4 or tuple(pixel_values_BxhxwxC.shape[1:]) != want:
      raise ValueError(f"pixel_values must be [B, {v.image_size}, {v.image_size}, {v.num_channels}] (NHWC), "
                       f"got shape {tuple(pixel_values_BxhxwxC.shape)}")
    b = pixel_values_BxhxwxC.shape[0]
    patches_BxNxD = self.patch_embedding(pixel_values_BxhxwxC).reshape(b, v.grid ** 2, v.hidden_size)
    cls_Bx1xD = jnp.broadcast_to(self.class_embedding[...].astype(patches_BxNxD.dtype), (b, 1, v.hidden_size))
    x_BxTxD = jnp.concatenate([cls_Bx1xD, patches_BxNxD], axis=1)
    x_BxTxD = x_BxTxD + self.position_embedding[...].astype(x_BxTxD.dtype)
    for layer in self.layers:
      x_BxTxD = layer(x_BxTxD)
    return self.final_norm(x_BxTxD)


class BertAttention(nnx.Module):
  """BERT's attention block: queries from the text, keys and values from the text (self) or the image (cross,
  `kv_width` wide); then out-projection, residual and LayerNorm (post-norm)."""

  def __init__(self, cfg: ImageRewardConfig, t: BlipTextConfig, kv_width: int, *, rngs: nnx.Rngs):
    d = t.hidden_size
    self.num_heads, self.head_dim = t.num_attention_heads, t.head_dim
    self.q = linear(cfg, d, d, (EMBED, HEADS), rngs=rngs)
    self.k = linear(cfg, kv_width, d, (EMBED, KV), rngs=rngs)
    self.v = linear(cfg, kv_width, d, (EMBED, KV), rngs=rngs)
    self.o = linear(cfg, d, d, (HEADS, EMBED), rngs=rngs)
    self.norm = layer_norm(cfg, d, t.layer_norm_eps, rngs=rngs)

  def __call__(self, x_BxLxD, kv_BxTxE, mask_Bx1x1xT=None):
    b, l, _ = x_BxLxD.shape
    t = kv_BxTxE.shape[1]
    h, hd = self.num_heads, self.head_dim
    q_BxLxHxK = self.q(x_BxLxD).reshape(b, l, h, hd)
    k_BxTxHxK = self.k(kv_BxTxE).reshape(b, t, h, hd)
    v_BxTxHxK = self.v(kv_BxTxE).reshape(b, t, h, hd)
    return self.norm(self.o(attend(q_BxLxHxK, k_BxTxHxK, v_BxTxHxK, mask_Bx1x1xT)) + x_BxLxD)


class BertLayer(nnx.Module):
  """Self-attention, cross-attention to the image, then the feed-forward block with its residual LayerNorm."""

  def __init__(self, cfg: ImageRewardConfig, t: BlipTextConfig, *, rngs: nnx.Rngs):
    self.self_attn = BertAttention(cfg, t, t.hidden_size, rngs=rngs)
    self.cross_attn = BertAttention(cfg, t, t.encoder_width, rngs=rngs)
    self.fc1 = linear(cfg, t.hidden_size, t.intermediate_size, (EMBED, MLP), rngs=rngs)
    self.fc2 = linear(cfg, t.intermediate_size, t.hidden_size, (MLP, EMBED), rngs=rngs)
    self.ffn_norm = layer_norm(cfg, t.hidden_size, t.layer_norm_eps, rngs=rngs)
    self.act = ACTIVATIONS[t.hidden_act]

  def __call__(self, x_BxLxD, mask_Bx1x1xL, image_BxTxE):
    x_BxLxD = self.self_attn(x_BxLxD, x_BxLxD, mask_Bx1x1xL)
    x_BxLxD = self.cross_attn(x_BxLxD, image_BxTxE)  # every image token is attended (ImageReward's image_atts)
    return self.ffn_norm(self.fc2(self.act(self.fc1(x_BxLxD))) + x_BxLxD)


class BlipText(nnx.Module):
  """Word and learned position embeddings with their LayerNorm, then the cross-attending layers."""

  def __init__(self, cfg: ImageRewardConfig, *, rngs: nnx.Rngs):
    t = cfg.text
    self.cfg = t
    self.word_embeddings = nnx.Embed(t.vocab_size, t.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                     embedding_init=nnx.initializers.normal(0.02), rngs=rngs,
                                     embedding_metadata={"out_sharding": (VOCAB, EMBED)})
    self.position_embeddings = nnx.Param(
        nnx.initializers.normal(0.02)(rngs.params(), (t.max_position_embeddings, t.hidden_size), cfg.param_dtype),
        out_sharding=(None, EMBED))
    self.embed_norm = layer_norm(cfg, t.hidden_size, t.layer_norm_eps, rngs=rngs)
    self.layers = nnx.List([BertLayer(cfg, t, rngs=rngs) for _ in range(t.num_hidden_layers)])

  def __call__(self, input_ids_BxL, attention_mask_BxL, image_BxTxE) -> jax.Array:
    """The prompt's tokens [B, L, D] after attending to themselves (padding masked) and to the image."""
    t = self.cfg
    if input_ids_BxL.ndim != 2 or tuple(attention_mask_BxL.shape) != tuple(input_ids_BxL.shape):
      raise ValueError(f"input_ids {tuple(input_ids_BxL.shape)} and attention_mask "
                       f"{tuple(attention_mask_BxL.shape)} must both be [B, L]")
    l = input_ids_BxL.shape[1]
    if l > t.max_position_embeddings:
      raise ValueError(f"input_ids length {l} exceeds max_position_embeddings={t.max_position_embeddings}")
    x_BxLxD = self.word_embeddings(input_ids_BxL) + self.position_embeddings[:l].astype(self.word_embeddings.dtype)
    x_BxLxD = self.embed_norm(x_BxLxD)
    mask_Bx1x1xL = (attention_mask_BxL != 0)[:, None, None, :]
    for layer in self.layers:
      x_BxLxD = layer(x_BxLxD, mask_Bx1x1xL, image_BxTxE)
    return x_BxLxD


class ImageRewardModel(nnx.Module):
  """The ViT, the text encoder and the head (the LAION aesthetic predictor's layout: five Linears, no
  activations, as ImageReward's MLP with its ReLUs commented out)."""

  def __init__(self, cfg: ImageRewardConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.vision = BlipVision(cfg, rngs=rngs)
    self.text = BlipText(cfg, rngs=rngs)
    self.head = AestheticHead(AestheticConfig(embed_dim=cfg.text.hidden_size, hidden=cfg.head_hidden,
                                              dtype=cfg.dtype, param_dtype=cfg.param_dtype), rngs=rngs)

  def __call__(self, pixel_values_BxhxwxC, input_ids_BxL, attention_mask_BxL) -> jax.Array:
    """ImageReward's scores [B] (float32) of preprocessed images and their tokenized prompts."""
    image_BxTxE = self.vision(pixel_values_BxhxwxC)
    text_BxLxD = self.text(input_ids_BxL, attention_mask_BxL, image_BxTxE)
    return (self.head(text_BxLxD[:, 0]) - self.cfg.mean) / self.cfg.std
