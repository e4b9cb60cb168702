"""ImageReward (Xu et al. 2023; model-backed, pure JAX): BLIP fine-tuned on 137k expert comparisons of generated
images (ImageRewardDB), the reward of Flow-GRPO and DiffusionNFT.

score = (mlp(text encoder's [CLS] after attending to the prompt and the image) - mean) / std, as
`ImageReward.score` computes it, on ImageReward's preprocessing (shortest side resized to 224 with PIL's bicubic,
centre crop, OpenAI's mean and std: `ImageProcessing`'s defaults at the model's size) and its tokenization (BERT,
padded to 35 tokens). Convert `THUDM/ImageReward`'s `ImageReward.pt` with `python -m checkpoints_convert.image_reward`;
its tokenizer is bert-base-uncased's (BLIP's extra [DEC] and [ENC] tokens are never produced for a prompt), so
pass that folder as `tokenizer_dir`:

    {"name": "image_reward", "weight": 1.0,
     "kwargs": {"ckpt_dir": "/ckpts/image_reward", "tokenizer_dir": "/ckpts/bert-base-uncased"}}
"""

from __future__ import annotations

import functools
import os

import jax.numpy as jnp

from glmrl.models.clip.preprocess import ImageProcessing, preprocess
from glmrl.models.clip.tokenizer import PromptTokenizer
from glmrl.rewards.registry import AbstractReward, ModelReward, check_images, register_factory

NAME = "image_reward"
PROMPT_IDS, PROMPT_MASK = "image_reward/prompt_ids", "image_reward/prompt_mask"
HOW_TO_MAKE = "convert ImageReward.pt with `python -m checkpoints_convert.image_reward`"


def preprocessing(image_size: int) -> ImageProcessing:
  """ImageReward's `_transform(n_px)`: Resize(n_px, bicubic) of the PIL image, CenterCrop(n_px), ToTensor,
  Normalize(OpenAI's mean and std); torchvision's crop offsets."""
  return ImageProcessing(shortest_edge=image_size, crop_height=image_size, crop_width=image_size,
                         crop_rounding="round")


def bert_tokenizer(directory: str, max_length: int) -> PromptTokenizer:
  """The prompt tokenizer: BERT's files in `directory` (vocab.txt or tokenizer.json), `max_length` tokens."""
  from transformers import BertTokenizerFast

  has = lambda name: os.path.isfile(os.path.join(directory, name))
  if not os.path.isdir(directory) or not (has("vocab.txt") or has("tokenizer.json")):
    raise ValueError(f"reward {NAME!r}: tokenizer_dir={directory!r} holds no BERT tokenizer (vocab.txt or "
                     "tokenizer.json; ImageReward's is bert-base-uncased's)")
  return PromptTokenizer(BertTokenizerFast.from_pretrained(directory), max_length)


def make_image_reward(model, tokenizer: PromptTokenizer | None, processing: ImageProcessing) -> ModelReward:
  """The reward of a loaded `ImageRewardModel`: prompts tokenized on the host (`prepare`), or here when they are
  given (outside jit, or as Python strings under it)."""

  def prepare(prompts, metadata):
    ids, mask = tokenizer(list(prompts))
    return {PROMPT_IDS: ids, PROMPT_MASK: mask}

  def reward(images, prompts, metadata):
    check_images(images, NAME)
    if metadata is not None and PROMPT_IDS in metadata:
      ids, mask = metadata[PROMPT_IDS], metadata[PROMPT_MASK]
    elif prompts is not None:
      if isinstance(prompts, str) or len(prompts) != images.shape[0]:
        raise ValueError(f"reward {NAME!r}: got {prompts!r} as prompts for {images.shape[0]} images")
      ids, mask = tokenizer(list(prompts))
    else:
      raise ValueError(f"reward {NAME!r} needs metadata[{PROMPT_IDS!r}] (the tokenized prompts) under jit: "
                       "merge RewardComposer.prepare(prompts, metadata) into the metadata first")
    return model(preprocess(images, processing), jnp.asarray(ids), jnp.asarray(mask))

  return ModelReward(reward, prepare)


@functools.lru_cache(maxsize=4)
def _load(ckpt_dir: str, sharding):
  from glmrl.models.stored_module import load_module
  from glmrl.models.blip.config import ImageRewardConfig
  from glmrl.models.blip.model import ImageRewardModel

  return load_module(ckpt_dir, ImageRewardConfig, ImageRewardModel, sharding, how_to_make=HOW_TO_MAKE)


def image_reward_factory(ckpt_dir: str, tokenizer_dir: str, *, sharding=None) -> ModelReward:
  """Loads (once per folder and sharding) the converted ImageReward; the tokenizer is read at once, so a wrong
  folder fails before any rollout."""
  if not isinstance(ckpt_dir, str) or not os.path.isdir(ckpt_dir):
    raise ValueError(f"reward {NAME!r}: ckpt_dir={ckpt_dir!r} is not a directory ({HOW_TO_MAKE})")
  model = _load(os.path.abspath(ckpt_dir), sharding)
  tokenizer = bert_tokenizer(tokenizer_dir, model.cfg.max_prompt_tokens)
  return make_image_reward(model, tokenizer, preprocessing(model.cfg.vision.image_size))


def image_reward_abstract(ckpt_dir=None, tokenizer_dir=None) -> AbstractReward:
  """The released ImageReward's layout unless `ckpt_dir` holds a converted folder (--mode=compile)."""
  from flax import nnx

  from glmrl.checkpoint.params import holds_config, read_config
  from glmrl.models.blip.config import ImageRewardConfig
  from glmrl.models.blip.model import ImageRewardModel
  from glmrl.models.init_rngs import InitRngs

  cfg = read_config(ckpt_dir, ImageRewardConfig.from_hf, HOW_TO_MAKE) if holds_config(ckpt_dir) else \
      ImageRewardConfig.full()
  module = nnx.eval_shape(lambda: ImageRewardModel(cfg, rngs=InitRngs(0)))
  row = ((cfg.max_prompt_tokens,), jnp.int32)
  return AbstractReward(module, lambda model: make_image_reward(model, None, preprocessing(cfg.vision.image_size)),
                        {PROMPT_IDS: row, PROMPT_MASK: row})


register_factory(NAME, image_reward_factory, pure_jax=True, abstract=image_reward_abstract)
