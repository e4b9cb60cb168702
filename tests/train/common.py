"""Small configs for the train tests: the demo config with fewer, cheaper steps."""

import os

from configs import demo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_config(**overrides):
  """configs/demo.py, with `section.key=value` overrides given as `section__key=value`."""
  c = demo.get_config()
  c.train.num_steps = 4
  c.checkpoint.save_interval = 2
  c.log.image_interval = 0
  c.grpo.group_size = 4
  for key, value in overrides.items():
    section, field = key.split("__")
    c[section][field] = value
  return c
