"""CLIP text-image score (model-backed, pure JAX): `scale * cos(image embedding, prompt embedding)`.

Default CLIP: openai/clip-vit-large-patch14, converted with `python -m checkpoints_convert.clip`.
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

from glmrl.rewards.registry import AbstractReward, ModelReward, check_images, register_factory

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
    text_BxE = jnp.asarray(metadata[key], jnp.float32)
  elif prompts is not None:
    if isinstance(prompts, str) or len(prompts) != batch:
      raise ValueError(f"reward {name!r}: got {prompts!r} as prompts for {batch} images")
    text_BxE = jnp.asarray(embedder.text_embeds(list(prompts)))
  else:
    raise ValueError(f"reward {name!r} needs metadata[{key!r}] (the prompts' text embeddings) under jit: "
                     "merge RewardComposer.prepare(prompts, metadata) into the metadata first")
  if tuple(text_BxE.shape) != (batch, embedder.dim):
    raise ValueError(f"reward {name!r}: text embeddings of shape {tuple(text_BxE.shape)}, expected "
                     f"({batch}, {embedder.dim})")
  return text_BxE


def cosine(embedder, images, text_BxE):
  """Cosine similarity [B] of each image with its row of unit-norm text embeddings."""
  return jnp.einsum("bp,bp->b", embedder.image_embeds(images), text_BxE)


def similarity_reward(name: str, text_key: str, embedder, scale: float, *, logit_scale: bool = False
                      ) -> ModelReward:
  """`scale * cos(image, prompt)` (times the checkpoint's learned logit scale with `logit_scale`), with
  the prompts' text embeddings prepared on the host under `text_key`: CLIP score and PickScore."""
  scale = _check_scale(name, scale)

  def prepare(prompts, metadata):
    return {text_key: embedder.text_embeds(prompts)}

  def reward(images, prompts, metadata):
    check_images(images, name)
    text_BxE = text_embeds_for(embedder, text_key, name, images, prompts, metadata)
    return (scale * embedder.logit_scale() if logit_scale else scale) * cosine(embedder, images, text_BxE)

  return ModelReward(reward, prepare)


def load_similarity_reward(name: str, text_key: str, ckpt_dir: str, scale: float, tokenizer_dir: str | None,
                           sharding, *, logit_scale: bool = False, processing=None, text_clean=None) -> ModelReward:
  """`similarity_reward` of a converted CLIP folder, loaded once per (folder, sharding, preprocessing);
  `processing`: the reward's own `ImageProcessing` (default: the folder's); `text_clean`: its own text cleaning
  before tokenizing."""
  from glmrl.models.clip.embedder import cached_embedder

  _check_scale(name, scale)
  embedder = cached_embedder(ckpt_dir, tokenizer_dir=tokenizer_dir, sharding=sharding, processing=processing,
                             text_clean=text_clean)
  return similarity_reward(name, text_key, embedder, scale, logit_scale=logit_scale)


def abstract_similarity(name: str, text_key: str, ckpt_dir, released, scale: float, *, logit_scale: bool = False,
                        processing=None) -> AbstractReward:
  """`similarity_reward`'s model as shapes (--mode=compile): the architecture of the converted folder `ckpt_dir`
  when it holds one, else the `released` ClipConfig; `processing(image_size)`: the reward's own preprocessing
  (default: the folder's, or CLIPImageProcessor's at the tower's size)."""
  from flax import nnx

  from glmrl.checkpoint.params import holds_config, read_config
  from glmrl.models.clip.checkpoint import load_image_processing
  from glmrl.models.clip.config import ClipConfig
  from glmrl.models.clip.embedder import ClipEmbedder
  from glmrl.models.clip.model import ClipModel
  from glmrl.models.clip.preprocess import ImageProcessing
  from glmrl.models.init_rngs import InitRngs

  scale = _check_scale(name, scale)
  folder = holds_config(ckpt_dir)
  cfg = read_config(ckpt_dir, ClipConfig.from_hf, "a converted CLIP folder") if folder else released
  size = cfg.vision.image_size
  if processing is not None:
    steps = processing(size)
  elif folder:
    steps = load_image_processing(ckpt_dir)
  else:
    steps = ImageProcessing(shortest_edge=size, crop_height=size, crop_width=size)
  module = nnx.eval_shape(lambda: ClipModel(cfg, rngs=InitRngs(0)))
  return AbstractReward(module, lambda model: similarity_reward(name, text_key, ClipEmbedder(model, steps), scale,
                                                                logit_scale=logit_scale),
                        {text_key: ((cfg.projection_dim,), jnp.float32)})


def make_clip_score(embedder, scale: float = 100.0) -> ModelReward:
  """The reward for a loaded `ClipEmbedder`."""
  return similarity_reward(NAME, TEXT_EMBEDS, embedder, scale)


def clip_score_factory(ckpt_dir: str, scale: float = 100.0, tokenizer_dir: str | None = None, *,
                       sharding=None) -> ModelReward:
  """Loads (once per folder and sharding) a converted CLIP; `tokenizer_dir` defaults to `ckpt_dir`."""
  return load_similarity_reward(NAME, TEXT_EMBEDS, ckpt_dir, scale, tokenizer_dir, sharding)


def clip_score_abstract(ckpt_dir=None, scale: float = 100.0, tokenizer_dir=None) -> AbstractReward:
  """openai/clip-vit-large-patch14's layout unless `ckpt_dir` holds a converted folder."""
  from glmrl.models.clip.config import ClipConfig

  return abstract_similarity(NAME, TEXT_EMBEDS, ckpt_dir, ClipConfig.full(), scale)


register_factory(NAME, clip_score_factory, pure_jax=True, abstract=clip_score_abstract)
