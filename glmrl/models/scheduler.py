"""The flow-matching scheduler's config (`scheduler/scheduler_config.json` of the checkpoint).

The schedule it defines is computed in `glmrl.sampling.scheduler`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from glmrl.models.config_fields import HFConfig

_TIME_SHIFT_TYPES = ("exponential", "linear")
# Scheduler options the GLM-Image pipeline does not use; accepted only at their off value.
_UNSUPPORTED_OFF = {
    "invert_sigmas": False,
    "shift_terminal": None,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "stochastic_sampling": False,
}


@dataclasses.dataclass(frozen=True)
class SchedulerConfig(HFConfig):
  """`scheduler/scheduler_config.json` of the checkpoint."""
  HF_FIXED = {"_class_name": "FlowMatchEulerDiscreteScheduler", **_UNSUPPORTED_OFF}
  num_train_timesteps: int = 1000
  shift: float = 1.0
  use_dynamic_shifting: bool = True
  base_shift: float = 0.25
  max_shift: float = 0.75
  base_image_seq_len: int = 256
  max_image_seq_len: int = 4096
  time_shift_type: str = "linear"

  def __post_init__(self):
    if self.time_shift_type not in _TIME_SHIFT_TYPES:
      raise ValueError(f"time_shift_type={self.time_shift_type!r}, expected one of {_TIME_SHIFT_TYPES}")
    if self.num_train_timesteps < 1:
      raise ValueError(f"num_train_timesteps={self.num_train_timesteps} must be >= 1")

  @classmethod
  def full(cls) -> "SchedulerConfig":
    """Released GLM-Image values (tests/fixtures/released/scheduler_config.json)."""
    return cls()

  @classmethod
  def tiny(cls) -> "SchedulerConfig":
    return cls()

  @classmethod
  def from_hf(cls, config: dict[str, Any], **overrides) -> "SchedulerConfig":
    for key, off in _UNSUPPORTED_OFF.items():
      if config.get(key) not in (None, False):
        raise ValueError(f"scheduler option {key}={config[key]!r} is not supported (GLM-Image uses {off!r})")
    return super().from_hf(config, **overrides)
