"""GRPO on the released GLM-Image, text-to-image at 1024 x 1024.

python main.py --config=configs/glm_image_t2i.py --config.model.checkpoint_dir=CONVERTED
  --config.data.prompts_file=prompts.txt --workdir=DIR
`:tiny` shrinks it to the random tiny model and a 64 x 64 target for a local run.
"""

import os

from ml_collections import config_dict

from configs import common


def get_config(arg=None):
  c = common.base_config()
  # Sampling as the released generation config and pipeline: T 0.9, top-p 0.75, 50 steps, CFG 1.5.
  c.data.height = 1024
  c.data.width = 1024
  c.data.prompts_per_step = 8
  c.data.max_prompt_tokens = 256
  c.data.max_glyph_tokens = 256  # ByT5 bytes of all quoted texts of a prompt: a poster's worth of text
  c.grpo.group_size = 16
  c.sampling.temperature = 0.9
  c.sampling.top_p = 0.75
  c.sampling.dit_steps = 50
  c.sampling.guidance_scale = 1.5
  c.model.checkpoint_dir = config_dict.placeholder(str)  # required: the converted folder
  c.model.preset = "full"
  c.model.param_dtype = "float32"
  c.model.compute_dtype = "bfloat16"
  c.model.remat = True
  c.optim.learning_rate = 1e-6
  c.optim.warmup_steps = 10
  c.train.num_steps = 1000
  c.train.micro_batch_size = 16
  c.rewards = (config_dict.ConfigDict({"name": "jpeg_compressibility", "weight": 1.0}),)
  if arg == "tiny":
    c.model.checkpoint_dir = ""
    c.model.preset = "tiny"
    c.model.compute_dtype = "float32"
    c.model.remat = False
    c.data.prompts_file = os.path.join(os.path.dirname(__file__), "data", "demo_prompts.txt")
    c.data.height = c.data.width = 64
    c.data.max_prompt_tokens = 64  # room for a real chat template (a converted tiny checkpoint's)
    c.data.max_glyph_tokens = 16
    c.data.prompts_per_step = 2
    c.grpo.group_size = 4
    c.sampling.dit_steps = 4
    c.train.micro_batch_size = 0
    c.train.num_steps = 10
  elif arg:
    raise ValueError(f"unknown config argument {arg!r}; expected nothing or 'tiny'")
  return c
