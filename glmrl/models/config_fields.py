"""What the model configs share: reading and writing their HF config dicts (`HFConfig`), checking sizes."""

from __future__ import annotations

import copy
import dataclasses
from typing import ClassVar

from glmrl.errors import UserError


def known_fields(cls, d: dict, *, drop_none: bool = False) -> dict:
  """The entries of `d` that are fields of the dataclass `cls` (HF configs carry many unrelated
  keys); `drop_none`: also leave out None values, so the dataclass default applies."""
  names = {f.name for f in dataclasses.fields(cls)}
  return {k: v for k, v in d.items() if k in names and not (drop_none and v is None)}


def check_positive_ints(obj, names, *, optional: bool = False) -> None:
  """UserError naming `Class.field=value` for the first of `names` that is not a positive int
  (bools are refused); `optional`: None is allowed."""
  for name in names:
    value = getattr(obj, name)
    if optional and value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise UserError(f"{type(obj).__name__}.{name}={value!r} must be a positive int")


class HFConfig:
  """A frozen model config read from and written to its reference's config dict (a dataclass mixin).

  A subclass names `HF_DEFAULTS`, the reference class's defaults for keys a config.json leaves out (a None value
  takes the default too); `HF_FIXED`, the entries every written dict carries (class name, architectures, options
  the port supports one way only); `RUNTIME`, its fields that are runtime options (dtypes, kernels), not the
  reference's. `from_hf` reads the known keys over the defaults; `to_hf` writes the fixed entries and every other
  field, tuples as lists (as JSON holds them). A config with its own layout of the dict overrides either.
  """
  HF_DEFAULTS: ClassVar[dict] = {}
  HF_FIXED: ClassVar[dict] = {}
  RUNTIME: ClassVar[tuple[str, ...]] = ()

  @classmethod
  def from_hf(cls, d: dict, **overrides):
    bad = sorted(set(overrides) - set(cls.RUNTIME))
    if bad:
      raise ValueError(f"overrides {bad} are not runtime fields of {cls.__name__} {cls.RUNTIME}")
    read = {k: v for k, v in known_fields(cls, d, drop_none=True).items() if k not in cls.RUNTIME}
    return cls(**{**cls.HF_DEFAULTS, **read, **overrides})

  def to_hf(self) -> dict:
    as_json = lambda v: list(v) if isinstance(v, tuple) else v
    return {**copy.deepcopy(self.HF_FIXED), **{f.name: as_json(getattr(self, f.name)) for f in dataclasses.fields(self)
                                if f.name not in self.RUNTIME}}
