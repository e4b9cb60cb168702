"""Loading a converted CLIP folder (`config.json`, `params/`, tokenizer and preprocessor files)."""

from __future__ import annotations

import json
import os

from flax import nnx

from glmrl.models.clip.model import ClipModel
from glmrl.models.clip.preprocess import ImageProcessing

# The name the converter registers CLIP under (`checkpoints_convert.components`).
COMPONENT = "clip"
PREPROCESSOR_CONFIG = "preprocessor_config.json"


def load_model(ckpt_dir: str, sharding=None, **config_overrides) -> ClipModel:
  """The CLIP model stored in `ckpt_dir`; keyword arguments set runtime fields (dtype, param_dtype).

  `sharding`: one jax Sharding for every parameter (e.g. replicated on the training mesh, so a
  jitted step over that mesh can read the weights); default: the first device.
  """
  from checkpoints_convert import components, hf_to_flax

  component = components.get(COMPONENT)
  cfg = component.config_from_hf(component.read_config(ckpt_dir), **config_overrides)
  graphdef, abstract, rest = component.build(cfg)
  return nnx.merge(graphdef, hf_to_flax.load_params(ckpt_dir, abstract, sharding), rest)


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
