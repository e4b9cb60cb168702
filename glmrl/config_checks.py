"""Validation of an experiment config before any work starts.

Unknown keys and wrongly typed overrides are rejected by ml_collections while
flags are parsed (the config is locked); this module checks required values and
value ranges, naming the offending key.
"""

import ml_collections
from ml_collections import config_dict

DTYPES = ("float32", "bfloat16")


class ConfigError(ValueError):
  """A config value is missing or out of range; the message names the key."""


def _walk(cfg, prefix="config"):
  for key in cfg.keys():
    name = f"{prefix}.{key}"
    try:
      value = cfg[key]
    except config_dict.RequiredValueError:
      raise ConfigError(f"{name} is required but has no value (pass --{name}=...)") from None
    if isinstance(value, ml_collections.ConfigDict):
      yield from _walk(value, name)
    else:
      yield name, value


def _check(ok, key, value, why):
  if not ok:
    raise ConfigError(f"{key}={value!r}: {why}")


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first missing or invalid value."""
  values = dict(_walk(cfg))
  for key in ("config.data.height", "config.data.width"):
    _check(values[key] > 0 and values[key] % 32 == 0, key, values[key], "must be a positive multiple of 32")
  _check(values["config.data.mode"] in ("t2i", "i2i"), "config.data.mode", values["config.data.mode"],
         "must be 't2i' or 'i2i'")
  _check(values["config.grpo.group_size"] >= 2, "config.grpo.group_size", values["config.grpo.group_size"],
         "must be at least 2 (advantages are relative to the group)")
  for key in ("config.data.prompts_per_step", "config.grpo.num_iterations", "config.train.num_steps",
              "config.sampling.dit_steps", "config.checkpoint.save_interval", "config.checkpoint.max_to_keep",
              "config.train.max_consecutive_nonfinite"):
    _check(values[key] >= 1, key, values[key], "must be >= 1")
  for key in ("config.model.param_dtype", "config.model.compute_dtype"):
    _check(values[key] in DTYPES, key, values[key], f"must be one of {DTYPES}")
  _check(values["config.grpo.loss_tokens"] in ("all", "target"), "config.grpo.loss_tokens",
         values["config.grpo.loss_tokens"], "must be 'all' or 'target'")
  _check(values["config.model.preset"] in ("tiny", "full"), "config.model.preset", values["config.model.preset"],
         "must be 'tiny' or 'full'")
  _check(values["config.sampling.temperature"] > 0, "config.sampling.temperature",
         values["config.sampling.temperature"], "must be > 0")
  _check(0 < values["config.sampling.top_p"] <= 1, "config.sampling.top_p", values["config.sampling.top_p"],
         "must be in (0, 1]")
  _check(values["config.sampling.top_k"] >= 0, "config.sampling.top_k", values["config.sampling.top_k"],
         "must be >= 0 (0 disables)")
  for key in ("config.grpo.epsilon_low", "config.grpo.epsilon_high", "config.grpo.beta",
              "config.train.micro_batch_size", "config.eval.interval", "config.log.image_interval"):
    _check(values[key] >= 0, key, values[key], "must be >= 0")
  _check(values["config.grpo.epsilon_low"] < 1, "config.grpo.epsilon_low", values["config.grpo.epsilon_low"],
         "must be < 1")
  for axis in ("data", "fsdp", "tensor"):
    key = f"config.mesh.{axis}"
    _check(values[key] == -1 or values[key] >= 1, key, values[key], "must be -1 (the rest) or >= 1")
  mesh = {a: values[f"config.mesh.{a}"] for a in ("data", "fsdp", "tensor")}
  _check(list(mesh.values()).count(-1) <= 1, "config.mesh", mesh, "at most one axis may be -1")
  for i, reward in enumerate(cfg.rewards):
    _check("name" in reward and "weight" in reward, f"config.rewards[{i}]", dict(reward),
           "each reward needs a name and a weight")
