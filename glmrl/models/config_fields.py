"""What the model configs share: reading the known fields of an HF config dict, checking sizes."""

from __future__ import annotations

import dataclasses


def known_fields(cls, d: dict, *, drop_none: bool = False) -> dict:
  """The entries of `d` that are fields of the dataclass `cls` (HF configs carry many unrelated
  keys); `drop_none`: also leave out None values, so the dataclass default applies."""
  names = {f.name for f in dataclasses.fields(cls)}
  return {k: v for k, v in d.items() if k in names and not (drop_none and v is None)}


def check_positive_ints(obj, names, *, optional: bool = False) -> None:
  """ValueError naming `Class.field=value` for the first of `names` that is not a positive int
  (bools are refused); `optional`: None is allowed."""
  for name in names:
    value = getattr(obj, name)
    if optional and value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ValueError(f"{type(obj).__name__}.{name}={value!r} must be a positive int")
