"""Loading a converted CLIP folder (`config.json`, `params/`, tokenizer and preprocessor files)."""

from __future__ import annotations

import json
import os

from glmrl.models.stored_module import load_module
from glmrl.models.clip.config import ClipConfig
from glmrl.models.clip.model import ClipModel
from glmrl.models.clip.preprocess import ImageProcessing

PREPROCESSOR_CONFIG = "preprocessor_config.json"


def load_clip(ckpt_dir: str, sharding=None, **config_overrides) -> ClipModel:
  """The CLIP model stored in `ckpt_dir`; keyword arguments set runtime fields (dtype, param_dtype).

  `sharding`: one jax Sharding for every parameter (e.g. replicated on the training mesh, so a
  jitted step over that mesh can read the weights); default: the first device.
  """
  return load_module(
      ckpt_dir, ClipConfig, ClipModel, sharding, **config_overrides,
      how_to_make="convert a CLIPModel folder with `python -m checkpoints_convert.clip`")


def load_image_processing(directory: str) -> ImageProcessing:
  """The folder's `preprocessor_config.json`, or CLIPImageProcessor's defaults (224, bicubic, OpenAI
  mean/std, what both released checkpoints use) when the folder has none."""
  path = os.path.join(directory, PREPROCESSOR_CONFIG)
  if not os.path.isfile(path):
    return ImageProcessing.full()
  with open(path) as f:
    try:
      return ImageProcessing.from_hf(json.load(f))
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e})") from e
