"""Embedded default: a tiny random GLM-Image trained on a built-in reward on a laptop CPU.

`python main.py --config=configs/demo.py --workdir=/tmp/glmrl_demo`
"""

import os

from configs import common


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown config argument {arg!r}; this config takes none")
  c = common.base_config()
  c.model.preset = "tiny"
  c.data.prompts_file = os.path.join(os.path.dirname(__file__), "data", "demo_prompts.txt")
  c.data.height = 64
  c.data.width = 64
  c.data.prompts_per_step = 2
  c.data.max_prompt_tokens = 32
  c.data.max_glyph_tokens = 16
  c.sampling.dit_steps = 4
  # The tiny random decoder responds weakly to the AR tokens; a strong guidance scale
  # amplifies exactly the token-conditioned part of its prediction.
  c.sampling.guidance_scale = 5.0
  c.sampling.top_p = 1.0
  # Only the 2x2 target grid reaches the decoder; the 16x16 preview grid only conditions it.
  c.grpo.loss_tokens = "target"
  c.grpo.group_size = 8
  c.optim.learning_rate = 1e-3
  c.optim.warmup_steps = 2
  c.train.num_steps = 60
  c.checkpoint.save_interval = 20
  c.log.image_interval = 10
  return c
