"""LAION aesthetic predictor (model-backed, pure JAX): the MLP head on unit-norm CLIP ViT-L/14 image
embeddings, about 1-10 (higher is more aesthetic), the reward of DDPO and Flow-GRPO.

Needs two converted folders: the CLIP (`python -m checkpoints_convert.clip` of
openai/clip-vit-large-patch14) and the head (`python -m checkpoints_convert.aesthetic --pth
sac+logos+ava1-l14-linearMSE.pth --out_dir ...`):

    {"name": "laion_aesthetic", "weight": 1.0,
     "kwargs": {"clip_dir": "/ckpts/clip-vit-large-patch14", "head_dir": "/ckpts/aesthetic"}}
"""

from __future__ import annotations

import functools
import os

from glmrl.rewards.registry import ModelReward, check_images, register_factory

NAME = "laion_aesthetic"


def make_aesthetic(embedder, head) -> ModelReward:
  """The reward for a loaded `ClipEmbedder` and `AestheticHead`."""
  if head.cfg.embed_dim != embedder.dim:
    raise ValueError(f"reward {NAME!r}: the head reads {head.cfg.embed_dim}-d embeddings, the CLIP gives "
                     f"{embedder.dim}-d ones")

  def aesthetic(images, prompts, metadata):
    check_images(images, NAME)
    return head(embedder.image_embeds(images))

  return ModelReward(aesthetic)


@functools.lru_cache(maxsize=2)
def _cached_head(head_dir: str, sharding):
  from glmrl.models.clip.aesthetic import load_head

  return load_head(head_dir, sharding)


def aesthetic_factory(clip_dir: str, head_dir: str, *, sharding=None) -> ModelReward:
  """Loads (once per folder and sharding) the converted CLIP and aesthetic head."""
  from glmrl.models.clip.embedder import cached_embedder

  if not isinstance(head_dir, str) or not head_dir:
    raise ValueError(f"reward {NAME!r}: head_dir={head_dir!r} must name a converted aesthetic head folder")
  return make_aesthetic(cached_embedder(clip_dir, sharding=sharding),
                        _cached_head(os.path.abspath(head_dir), sharding))


register_factory(NAME, aesthetic_factory, pure_jax=True)
