import importlib.util
import os

import pytest

from glmrl import config_checks
from configs import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name, arg=None):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def test_missing_required_value_is_named():
  cfg = common.base_config()
  with pytest.raises(config_checks.ConfigError, match=r"config.data.prompts_file is required"):
    config_checks.validate(cfg)


def test_demo_config_is_valid():
  config_checks.validate(load_config("demo"))


def test_every_config_field_is_commented():
  # Every assignment in the config files carries a comment saying what it does.
  text = open(os.path.join(ROOT, "configs", "common.py")).read().splitlines()
  fields = [line for line in text if line.strip().startswith("c.") and " = " in line
            and "ConfigDict()" not in line]
  assert fields and all("#" in line for line in fields), [l for l in fields if "#" not in l]


@pytest.mark.parametrize("key,value,message", [
    ("mesh.data", -1, "at most one axis may be -1"),
    ("sampling.top_p", 0.0, "config.sampling.top_p=0.0"),
    ("grpo.epsilon_low", 1.0, "config.grpo.epsilon_low=1.0: must be < 1"),
    ("data.mode", "video", "config.data.mode='video'"),
])
def test_range_errors(key, value, message):
  cfg = load_config("demo")
  section, field = key.split(".")
  cfg[section][field] = value
  with pytest.raises(config_checks.ConfigError, match=message):
    config_checks.validate(cfg)
