"""Key rules shared by both conversion directions (HF <-> Flax).

A component's key map is a table of `Rule(hf, flax, transform)`. `hf` and
`flax` are dotted templates whose `{name}` placeholders match one path segment
(`{i}`, `{j}`, ... match integers); the same placeholder values fill the other
side. `transform` turns an HF tensor into the Flax array and back, exactly
(pure axis permutations / reshapes, so the round trip is bit-exact).

    Rule("model.layers.{i}.self_attn.q_proj.weight",
         "text.layers.{i}.attn.q.kernel", TRANSPOSE)
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Sequence

import numpy as np

from glmrl.checkpoint.params import flax_path_str  # noqa: F401  (the path spelling the rules match)


@dataclasses.dataclass(frozen=True)
class Permute:
  """Axis permutation: flax = hf.transpose(perm)."""
  perm: tuple[int, ...]

  def to_flax(self, a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(a, self.perm))

  def to_hf(self, a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(a, np.argsort(self.perm)))

  def flax_shape(self, hf_shape: Sequence[int]) -> tuple[int, ...]:
    if len(hf_shape) != len(self.perm):
      raise ValueError(f"rank {len(hf_shape)} tensor for permutation {self.perm}")
    return tuple(hf_shape[p] for p in self.perm)

  def hf_shape(self, flax_shape: Sequence[int]) -> tuple[int, ...]:
    if len(flax_shape) != len(self.perm):
      raise ValueError(f"rank {len(flax_shape)} tensor for permutation {self.perm}")
    return tuple(int(flax_shape[p]) for p in np.argsort(self.perm))


@dataclasses.dataclass(frozen=True)
class Reshape:
  """Reshape between an HF shape and a Flax shape of the same size (row-major)."""
  hf: tuple[int, ...]
  flax: tuple[int, ...]

  def to_flax(self, a):
    return np.reshape(a, self.flax)

  def to_hf(self, a):
    return np.reshape(a, self.hf)

  def flax_shape(self, hf_shape):
    if tuple(hf_shape) != self.hf:
      raise ValueError(f"expected {self.hf} for reshape, got {tuple(hf_shape)}")
    return self.flax

  def hf_shape(self, flax_shape):
    if tuple(flax_shape) != self.flax:
      raise ValueError(f"expected {self.flax} for reshape, got {tuple(flax_shape)}")
    return self.hf


@dataclasses.dataclass(frozen=True)
class Identity:
  def to_flax(self, a):
    return a

  def to_hf(self, a):
    return a

  def flax_shape(self, hf_shape):
    return tuple(hf_shape)

  def hf_shape(self, flax_shape):
    return tuple(flax_shape)


IDENTITY = Identity()
TRANSPOSE = Permute((1, 0))            # torch Linear [out, in] -> kernel [in, out]
CONV2D = Permute((2, 3, 1, 0))         # torch OIHW -> flax HWIO
CONV3D = Permute((2, 3, 4, 1, 0))      # torch OIDHW -> flax DHWIO


@dataclasses.dataclass(frozen=True)
class Rule:
  hf: str
  flax: str
  transform: object = IDENTITY


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _compile(template: str) -> re.Pattern:
  pattern, pos = [], 0
  for m in _PLACEHOLDER.finditer(template):
    pattern.append(re.escape(template[pos:m.start()]))
    name = m.group(1)
    body = r"\d+" if len(name) == 1 and name in "ijklmn" else r"[^.]+"
    pattern.append(f"(?P<{name}>{body})")
    pos = m.end()
  pattern.append(re.escape(template[pos:]))
  return re.compile("".join(pattern) + r"\Z")


class KeyMap:
  """Matches keys of one side of a rule table and renders the other side."""

  def __init__(self, rules: Iterable[Rule]):
    self.rules = tuple(rules)
    self._hf = [(_compile(r.hf), r) for r in self.rules]
    self._flax = [(_compile(r.flax), r) for r in self.rules]

  def hf_to_flax(self, hf_key: str) -> tuple[str, object] | None:
    """(flax path, transform) for an HF key, or None if no rule matches."""
    for pattern, rule in self._hf:
      m = pattern.match(hf_key)
      if m:
        return rule.flax.format(**m.groupdict()), rule.transform
    return None

  def flax_to_hf(self, flax_path: str) -> tuple[str, object] | None:
    """(HF key, transform) for a dotted Flax path, or None if no rule matches."""
    for pattern, rule in self._flax:
      m = pattern.match(flax_path)
      if m:
        return rule.hf.format(**m.groupdict()), rule.transform
    return None
