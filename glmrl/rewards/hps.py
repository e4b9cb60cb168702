"""HPS v2.1 (Wu et al. 2023, Human Preference Score v2; model-backed, pure JAX): OpenCLIP's ViT-H/14 fine-tuned
on 798k human preference choices between generated images (HPD v2).

score = scale * cos(image embedding, prompt embedding), as `hpsv2.score` computes it (the diagonal of the unit
image features times the unit text features: no logit scale), on HPS' own preprocessing (`preprocessing`: the
image as floats, its longest side resized to the tower's 224 with antialiased bicubic, padded to 224 x 224 with
zeros, OpenAI's mean and std). DanceGRPO, MixGRPO and TempFlow-GRPO train on it as it is. Convert `xswu/HPSv2`'s `HPS_v2.1_compressed.pt` with
`python -m checkpoints_convert.hps`; its tokenizer is laion/CLIP-ViT-H-14-laion2B-s32B-b79K's, so pass that
folder as `tokenizer_dir`:

    {"name": "hps", "weight": 1.0, "kwargs": {"ckpt_dir": "/ckpts/hps_v2.1", "tokenizer_dir": "/ckpts/clip-vit-h-14"}}
"""

from __future__ import annotations

import html
import re

from glmrl.checkpoint.params import read_config
from glmrl.models.clip.config import ClipConfig
from glmrl.models.clip.preprocess import ImageProcessing
from glmrl.rewards.clip_score import abstract_similarity, load_similarity_reward, similarity_reward
from glmrl.rewards.registry import AbstractReward, ModelReward, register_factory

NAME = "hps"
TEXT_EMBEDS = "hps/text_embeds"
HOW_TO_MAKE = "convert HPS_v2.1_compressed.pt with `python -m checkpoints_convert.hps`"


def preprocessing(image_size: int) -> ImageProcessing:
  """hpsv2's `preprocess_val` (open_clip's `image_transform(image_size, is_train=False, resize_longest_max=True)`):
  ToTensor, ResizeMaxSize(image_size, bicubic, fill=0), Normalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)."""
  return ImageProcessing(shortest_edge=None, longest_edge=image_size, uint8_passes=False, pad_size=image_size,
                         do_center_crop=False)


def open_clip_text(text: str) -> str:
  """OpenCLIP's text cleaning before its BPE (`open_clip.tokenizer`: ftfy's fixes, HTML entities unescaped twice,
  runs of whitespace to one space, lower case), which hpsv2 tokenizes with and transformers' CLIP tokenizer does not
  do ("Tom &amp; Jerry" is "tom & jerry" to HPS; mojibake like "Ã©cole" is "école")."""
  import ftfy

  text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
  return re.sub(r"\s+", " ", text).strip().lower()


def make_hps(embedder, scale: float = 1.0) -> ModelReward:
  """The reward for a loaded `ClipEmbedder` of HPS v2.1 (built with `preprocessing`)."""
  return similarity_reward(NAME, TEXT_EMBEDS, embedder, scale)


def hps_factory(ckpt_dir: str, scale: float = 1.0, tokenizer_dir: str | None = None, *,
                sharding=None) -> ModelReward:
  """Loads (once per folder and sharding) the converted HPS v2.1 CLIP, with HPS' preprocessing."""
  image_size = read_config(ckpt_dir, ClipConfig.from_hf, HOW_TO_MAKE).vision.image_size
  return load_similarity_reward(NAME, TEXT_EMBEDS, ckpt_dir, scale, tokenizer_dir, sharding,
                                processing=preprocessing(image_size), text_clean=open_clip_text)


def hps_abstract(ckpt_dir=None, scale: float = 1.0, tokenizer_dir=None) -> AbstractReward:
  """HPS v2.1's layout (OpenCLIP ViT-H/14, as converted) unless `ckpt_dir` holds a converted folder."""
  return abstract_similarity(NAME, TEXT_EMBEDS, ckpt_dir, ClipConfig.vit_h14(), scale, processing=preprocessing)


register_factory(NAME, hps_factory, pure_jax=True, abstract=hps_abstract)
