"""Embedded decoder-RL demo: Flow-GRPO on the DiT of a tiny random GLM-Image, on a laptop CPU, in minutes.

The AR generator is sampled but not trained (one token grid per prompt); the DiT's adapters learn from
`decoder.group_size` SDE samples of each grid. `python main.py --config=configs/demo_decoder.py --workdir=DIR`
"""

from configs import demo


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown config argument {arg!r}; this config takes none")
  c = demo.get_config()
  c.train.policies = "decoder"
  c.train.num_steps = 30
  c.data.prompts_per_step = 2
  c.decoder.group_size = 8
  c.decoder.train_steps = 4
  c.decoder.window_size = 2
  c.decoder.window_start = -1
  c.decoder.lora.rank = 8
  c.decoder.lora.alpha = 16.0
  c.decoder.optim.learning_rate = 1e-2
  # The tiny random VAE's brightness hardly moves with its latents; its saturation does (a "detail" reward
  # the decoder can raise on its own, as the report gives the decoder the high-frequency rewards).
  c.decoder.rewards = ({"name": "saturation", "weight": 1.0},)
  c.checkpoint.save_interval = 10
  c.log.image_interval = 10
  return c
