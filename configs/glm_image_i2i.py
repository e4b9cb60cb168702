"""GRPO on the released GLM-Image, image-to-image (editing) at 1024 x 1024.

The prompts file is .jsonl with `source_images` on every line (and optionally `target_image` for the
target-similarity rewards). `:tiny` shrinks it for a local run.
"""

import os

from ml_collections import config_dict

from configs import glm_image_t2i


def get_config(arg=None):
  c = glm_image_t2i.get_config(arg)
  c.data.mode = "i2i"
  c.rewards = (config_dict.ConfigDict({"name": "target_neg_mse", "weight": 1.0}),)
  if arg == "tiny":
    c.data.prompts_file = os.path.join(os.path.dirname(__file__), "data", "i2i_demo.jsonl")
  return c
