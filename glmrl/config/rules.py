"""The rule types of the key table (`glmrl.config.keys.RULES`) and the error every config check raises."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from glmrl.errors import UserError


class ConfigError(UserError):
  """A config value is missing or out of range; the message names the key."""


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one field accepts: a type, then an optional predicate described by `why`."""
  kind: type | tuple[type, ...]
  ok: Callable[[Any], bool] = lambda v: True
  why: str = ""

  def check(self, key: str, value: Any) -> None:
    if value is None:
      raise ConfigError(f"{key} is required but has no value (pass --{key}=...)")
    numeric = self.kind in (int, float, (int, float))
    if isinstance(value, bool) and self.kind is not bool or not isinstance(value, self.kind):
      raise ConfigError(f"{key}={value!r}: must be {_type_name(self.kind)}, not {type(value).__name__}")
    if numeric and not math.isfinite(value):
      raise ConfigError(f"{key}={value!r}: must be finite")
    if not self.ok(value):
      raise ConfigError(f"{key}={value!r}: {self.why}")


def _type_name(kind) -> str:
  kinds = kind if isinstance(kind, tuple) else (kind,)
  return " or ".join({int: "an integer", float: "a number", bool: "True or False", str: "a string"}.get(k, k.__name__)
                     for k in kinds)


def choice(*options) -> Rule:
  return Rule(str, lambda v: v in options, f"must be one of {list(options)}")


def integer(low: int, why: str = "") -> Rule:
  return Rule(int, lambda v: v >= low, why or f"must be >= {low}")


def number(ok: Callable[[float], bool], why: str) -> Rule:
  return Rule((int, float), ok, why)


BOOL = Rule(bool)
STRING = Rule(str)
POSITIVE = number(lambda v: v > 0, "must be > 0")
NON_NEGATIVE = number(lambda v: v >= 0, "must be >= 0")
UNIT_OPEN = number(lambda v: 0 <= v < 1, "must be in [0, 1)")
# A PPO clip's lower side: the ratio's lower bound 1 - epsilon stays >= 0 (1: unbounded below, AWM's released value).
CLIP_LOW = number(lambda v: 0 <= v <= 1, "must be in [0, 1] (the ratio's lower bound 1 - epsilon must not be negative)")
MESH_AXIS = Rule(int, lambda v: v == -1 or v >= 1, "must be -1 (the remaining devices) or >= 1")
PIXELS = Rule(int, lambda v: v > 0 and v % 32 == 0, "must be a positive multiple of 32 (one AR token per 32 px)")


def check(ok: bool, key: str, value, why: str) -> None:
  if not ok:
    raise ConfigError(f"{key}={value!r}: {why}")
