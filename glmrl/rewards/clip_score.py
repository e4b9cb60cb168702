"""CLIP text-image score (model-backed, pure JAX): `scale * cos(image embedding, prompt embedding)`.

Default CLIP: openai/clip-vit-large-patch14, converted with `python -m glmrl.models.clip.convert`.
Default `scale=100`: the "CLIP score" of torchmetrics and of most text-to-image papers is
100 * max(cos, 0) (Hessel et al. 2021's CLIP-S is 2.5 * max(cos, 0)). The clamp at 0 is left out:
a reward must keep ranking the images of a group even when all of them score below 0. Flow-GRPO's
`clip_score` divides CLIPModel's logits by 30, i.e. exp(logit_scale) * cos / 30 = (100 / 30) * cos
for ViT-L/14 (whose logit scale is exactly 100): use `scale=FLOW_GRPO_SCALE` for that recipe.

Config entry:
    {"name": "clip_score", "weight": 1.0, "kwargs": {"ckpt_dir": "/ckpts/clip-vit-large-patch14"}}
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from glmrl.rewards.registry import ModelReward, check_images, register_factory

NAME = "clip_score"
TEXT_EMBEDS = "clip_score/text_embeds"
FLOW_GRPO_SCALE = 100.0 / 30.0


def _check_scale(name: str, scale) -> float:
  if isinstance(scale, bool) or not isinstance(scale, (int, float, np.number)) or not math.isfinite(scale):
    raise ValueError(f"reward {name!r}: scale={scale!r} must be a finite number")
  return float(scale)


def text_embeds_for(embedder, key: str, name: str, images, prompts, metadata):
  """The prompts' unit-norm text embeddings [B, P]: prepared ones from `metadata[key]`, else embedded
  now from `prompts` (possible outside jit only)."""
  batch = images.shape[0]
  if metadata is not None and key in metadata:
    text_BxP = jnp.asarray(metadata[key], jnp.float32)
  elif prompts is not None:
    if isinstance(prompts, str) or len(prompts) != batch:
      raise ValueError(f"reward {name!r}: got {prompts!r} as prompts for {batch} images")
    text_BxP = jnp.asarray(embedder.text_embeds(list(prompts)))
  else:
    raise ValueError(f"reward {name!r} needs metadata[{key!r}] (the prompts' text embeddings) under jit: "
                     "merge RewardComposer.prepare(prompts, metadata) into the metadata first")
  if tuple(text_BxP.shape) != (batch, embedder.dim):
    raise ValueError(f"reward {name!r}: text embeddings of shape {tuple(text_BxP.shape)}, expected "
                     f"({batch}, {embedder.dim})")
  return text_BxP


def cosine(embedder, images, text_BxP):
  """Cosine similarity [B] of each image with its row of unit-norm text embeddings."""
  return jnp.einsum("bp,bp->b", embedder.image_embeds(images), text_BxP)


def make_clip_score(embedder, scale: float = 100.0) -> ModelReward:
  """The reward for a loaded `ClipEmbedder`."""
  scale = _check_scale(NAME, scale)

  def prepare(prompts, metadata):
    return {TEXT_EMBEDS: embedder.text_embeds(prompts)}

  def clip_score(images, prompts, metadata):
    check_images(images, NAME)
    return scale * cosine(embedder, images, text_embeds_for(embedder, TEXT_EMBEDS, NAME, images, prompts, metadata))

  return ModelReward(clip_score, prepare)


def clip_score_factory(ckpt_dir: str, scale: float = 100.0, tokenizer_dir: str | None = None) -> ModelReward:
  """Loads (once per folder) a converted CLIP; `tokenizer_dir` defaults to `ckpt_dir`."""
  from glmrl.models.clip.embedder import cached_embedder

  _check_scale(NAME, scale)
  return make_clip_score(cached_embedder(ckpt_dir, tokenizer_dir=tokenizer_dir), scale)


register_factory(NAME, clip_score_factory, pure_jax=True)
