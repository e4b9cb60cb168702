"""TPU slices by the names users say (`v5p-64`, `v5e-256`, `v6e-8`) as abstract devices on this host.

`jax.experimental.topologies` describes a slice's chips without any TPU attached (it needs `libtpu`,
pinned in requirements-compile.txt, and `TPU_SKIP_MDS_QUERY=1` off Google Cloud); programs lowered
onto a mesh of those devices compile for that slice, and the compiler's per-chip memory figures are
the slice's. Name conventions, as Cloud TPU's: v5p-N counts TensorCores (2 per chip, N/2 chips);
v5e-N and v6e-N count chips.
"""

from __future__ import annotations

import dataclasses
import os
import re

from glmrl.errors import UserError


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_bytes: int          # per chip
  peak_bf16_flops: float  # per chip per second
  cores_per_chip: int     # what the slice name counts per chip
  hbm_bandwidth: float    # bytes per second per chip
  link_bandwidth: float   # inter-chip interconnect bytes per second per chip (all its links)


# Published per-chip figures (cloud.google.com/tpu/docs: v5p, v5e, v6e system architecture pages; the
# interconnect's Gbps / 8).
CHIPS = {
    "v5p": Chip("v5p", 95 * 10**9, 459e12, 2, 2765e9, 4800e9 / 8),
    "v5e": Chip("v5e", 16 * 10**9, 197e12, 1, 819e9, 1600e9 / 8),
    "v6e": Chip("v6e", 32 * 10**9, 918e12, 1, 1640e9, 3584e9 / 8),
}

# The `device_kind` libtpu gives each generation's devices.
DEVICE_KINDS = {"TPU v5": "v5p", "TPU v5p": "v5p", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v6 lite": "v6e",
                "TPU v6e": "v6e"}

# Chips -> the physical shape libtpu expects for that slice.
_V5P_SHAPES = {1: "1x1x1", 2: "1x2x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
               128: "4x4x8", 256: "4x8x8", 512: "8x8x8"}
_2D_SHAPES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str        # as the user said it, e.g. "v5p-64"
  chip: Chip
  chips: int
  shape: str       # libtpu topology, e.g. "2x4x4"

  @property
  def topology_name(self) -> str:
    return f"{self.chip.name}:{self.shape}"


def parse(name: str) -> Slice:
  """`v5p-64` -> Slice; UserError naming the known generations and sizes otherwise."""
  m = re.fullmatch(r"(v5p|v5e|v6e)-(\d+)", name or "")
  if not m:
    raise UserError(f"config.compile.topology={name!r}: expected <generation>-<size> with generation one of "
                    f"{sorted(CHIPS)}, e.g. v5p-64, v5e-256, v6e-8")
  chip, size = CHIPS[m.group(1)], int(m.group(2))
  if size % chip.cores_per_chip:
    raise UserError(f"config.compile.topology={name!r}: {chip.name} sizes count TensorCores, "
                    f"{chip.cores_per_chip} per chip")
  chips = size // chip.cores_per_chip
  shapes = _V5P_SHAPES if chip.name == "v5p" else _2D_SHAPES
  if chips not in shapes:
    sizes = [n * chip.cores_per_chip for n in sorted(shapes)]
    raise UserError(f"config.compile.topology={name!r}: no {chip.name} slice of that size here; known sizes {sizes}")
  return Slice(name, chip, chips, shapes[chips])


def devices(slice_: Slice):
  """The slice's abstract TPU devices (no TPU needed). Needs libtpu: a clear error when it is missing."""
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # off Google Cloud: no metadata server to ask
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # no TPU is driven: another libtpu user may run
  from jax.experimental import topologies

  try:
    return list(topologies.get_topology_desc(topology_name=slice_.topology_name, platform="tpu").devices)
  except Exception as e:  # pylint: disable=broad-except  # libtpu missing or refusing the topology
    raise UserError(f"cannot describe TPU topology {slice_.topology_name} ({slice_.name}): {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}. --mode=compile needs libtpu: "
                    "pip install -r requirements-compile.txt") from None


def chip_of(mesh) -> Chip:
  """The chip of a mesh of TPU devices (abstract or real), by their `device_kind`."""
  kind = mesh.devices.flat[0].device_kind
  if kind not in DEVICE_KINDS:
    raise UserError(f"unknown TPU device kind {kind!r}; known {sorted(DEVICE_KINDS)}")
  return CHIPS[DEVICE_KINDS[kind]]
