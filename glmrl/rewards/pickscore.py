"""PickScore (Kirstain et al. 2023, model-backed, pure JAX): a CLIP-H fine-tuned on Pick-a-Pic.

score = scale * exp(logit_scale) * cos(image embedding, prompt embedding), with the checkpoint's own
learned logit scale, as in the PickScore model card. Convert `yuvalkirstain/PickScore_v1` (the
OpenCLIP ViT-H/14 layout, `ClipConfig.vit_h14()`) with `python -m checkpoints_convert.clip`; its
tokenizer and preprocessing are laion/CLIP-ViT-H-14-laion2B-s32B-b79K's, so pass that folder as
`tokenizer_dir` when the PickScore folder has no tokenizer files. `scale=1` gives the raw PickScore
(around 20 for typical generations); Flow-GRPO's PickScore reward divides it by 26:

    {"name": "pickscore", "weight": 1.0,
     "kwargs": {"ckpt_dir": "/ckpts/pickscore", "tokenizer_dir": "/ckpts/clip-vit-h-14", "scale": 1 / 26}}

`FLOW_GRPO_SCALE` is that 1 / 26.
"""

from __future__ import annotations

from glmrl.rewards.clip_score import abstract_similarity, load_similarity_reward, similarity_reward
from glmrl.rewards.registry import AbstractReward, ModelReward, register_factory

NAME = "pickscore"
TEXT_EMBEDS = "pickscore/text_embeds"
FLOW_GRPO_SCALE = 1.0 / 26.0


def make_pickscore(embedder, scale: float = 1.0) -> ModelReward:
  """The reward for a loaded `ClipEmbedder` of PickScore."""
  return similarity_reward(NAME, TEXT_EMBEDS, embedder, scale, logit_scale=True)


def pickscore_factory(ckpt_dir: str, scale: float = 1.0, tokenizer_dir: str | None = None, *,
                      sharding=None) -> ModelReward:
  """Loads (once per folder and sharding) the converted PickScore CLIP."""
  return load_similarity_reward(NAME, TEXT_EMBEDS, ckpt_dir, scale, tokenizer_dir, sharding, logit_scale=True)


def pickscore_abstract(ckpt_dir=None, scale: float = 1.0, tokenizer_dir=None) -> AbstractReward:
  """PickScore_v1's layout (OpenCLIP ViT-H/14) unless `ckpt_dir` holds a converted folder."""
  from glmrl.models.clip.config import ClipConfig

  return abstract_similarity(NAME, TEXT_EMBEDS, ckpt_dir, ClipConfig.vit_h14(), scale, logit_scale=True)


register_factory(NAME, pickscore_factory, pure_jax=True, abstract=pickscore_abstract)
