"""The released recipes as `bench/fullsize.py` times them: GLM-Image's released sizes with random weights (no
checkpoint is needed to time the models, and none can be downloaded where the suite runs), the demo prompts, and
rewards that need no weights and no server in place of the recipes' model-backed and served ones. Everything else
(dtypes, LoRA ranks, groups, the decoder's window and KL, 1024 x 1024, 50 DiT steps) is the recipe's.

  python main.py --config=bench/fullsize_recipe.py:lora --workdir=DIR        (configs/glm_image_t2i_lora.py)
  python main.py --config=bench/fullsize_recipe.py:decoupled --workdir=DIR   (configs/glm_image_t2i_decoupled.py)
  python main.py --config=bench/fullsize_recipe.py:lora,tiny --workdir=DIR   (the recipe's `:tiny`, for a CPU)

The rewards: the LoRA recipe's own JPEG compressibility (it needs nothing); for the decoupled recipe the AR
policy's LAION aesthetics + PickScore (CLIP models) become JPEG compressibility and the decoder's served OCR text
accuracy becomes colorfulness (computed in JAX), so a step's `time/reward` is not the recipe's.
"""

import os

from ml_collections import config_dict

from configs import glm_image_t2i_decoupled, glm_image_t2i_lora

RECIPES = {"lora": glm_image_t2i_lora, "decoupled": glm_image_t2i_decoupled}
SIZES = ("full", "tiny")


def get_config(arg="lora"):
  recipe, _, size = (arg or "lora").partition(",")
  size = size or "full"
  if recipe not in RECIPES or size not in SIZES:
    raise ValueError(f"unknown config argument {arg!r}; expected RECIPE[,SIZE] with RECIPE one of {list(RECIPES)} "
                     f"and SIZE one of {list(SIZES)}")
  c = RECIPES[recipe].get_config("tiny" if size == "tiny" else None)
  c.model.checkpoint_dir = ""  # random weights of the preset's size ("full" unless tiny)
  c.data.prompts_file = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "data",
                                     "demo_prompts.txt")
  c.rewards = (config_dict.ConfigDict({"name": "jpeg_compressibility", "weight": 1.0}),)
  if recipe == "decoupled":
    c.decoder.rewards = (config_dict.ConfigDict({"name": "colorfulness", "weight": 1.0}),)
  return c
