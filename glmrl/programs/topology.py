"""TPU slices and NVIDIA GPU nodes by the names users say (`v5p-64`, `v6e-8`, `h100-8`, `h200-1`) as abstract
devices on this host.

`jax.experimental.topologies` describes a target's chips without any attached: TPU slices through `libtpu`
(requirements-compile.txt; `TPU_SKIP_MDS_QUERY=1` off Google Cloud), GPUs through the CUDA plugin
(requirements-compile-gpu.txt) and a target config describing the GPU model (`glmrl.programs.gpu_targets`).
Programs lowered onto a mesh of those devices compile for that target, and the compiler's per-chip memory figures
are the target's. Name conventions: as Cloud TPU's, v5p-N counts TensorCores (2 per chip, N/2 chips), v5e-N and
v6e-N count chips; h100-N and h200-N count GPUs, up to 8 on one node (NVLink), more as nodes of 8 (N a multiple
of 8) joined by the network.
"""

from __future__ import annotations

import dataclasses
import os
import re

from glmrl.errors import UserError
from glmrl.programs import gpu_targets


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_bytes: int          # per chip
  peak_bf16_flops: float  # per chip per second
  cores_per_chip: int     # what the slice name counts per chip
  hbm_bandwidth: float    # bytes per second per chip
  link_bandwidth: float   # inter-chip interconnect bytes per second per chip (all its links; GPUs: NVLink in)
  platform: str = "tpu"   # jax's platform name of its devices
  network_bandwidth: float = 0.0  # GPUs: bytes per second into one GPU from other nodes


# Published per-chip figures (cloud.google.com/tpu/docs: v5p, v5e, v6e system architecture pages; the
# interconnect's Gbps / 8).
CHIPS = {
    "v5p": Chip("v5p", 95 * 10**9, 459e12, 2, 2765e9, 4800e9 / 8),
    "v5e": Chip("v5e", 16 * 10**9, 197e12, 1, 819e9, 1600e9 / 8),
    "v6e": Chip("v6e", 32 * 10**9, 918e12, 1, 1640e9, 3584e9 / 8),
    # NVIDIA's H100 SXM and H200 data sheets: dense BF16 989 TFLOP/s, HBM 3.35 / 4.8 TB/s, NVLink 4 900 GB/s both
    # directions (450 in); memory as the device reports it (`gpu_targets`). Between nodes: one 400 Gb/s
    # InfiniBand NDR adapter per GPU, as DGX H100 / H200 and the clouds' H100 / H200 nodes have.
    "h100": Chip("h100", gpu_targets.H100_SXM.memory_bytes, 989e12, 1, 3.35e12, 450e9, "gpu", 400e9 / 8),
    "h200": Chip("h200", gpu_targets.H200.memory_bytes, 989e12, 1, 4.8e12, 450e9, "gpu", 400e9 / 8),
}
GPU_MODELS = {"h100": gpu_targets.H100_SXM, "h200": gpu_targets.H200}
GPUS_PER_NODE = 8
_GPU_SIZES = (1, 2, 4, 8, 16, 32, 64)

# The `device_kind` of each generation's devices: libtpu's for TPUs, `cudaDeviceProp.name` for GPUs.
DEVICE_KINDS = {"TPU v5": "v5p", "TPU v5p": "v5p", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v6 lite": "v6e",
                "TPU v6e": "v6e", gpu_targets.H100_SXM.name: "h100", gpu_targets.H200.name: "h200",
                "NVIDIA H200": "h200"}

# Chips -> the physical shape libtpu expects for that slice.
_V5P_SHAPES = {1: "1x1x1", 2: "1x2x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
               128: "4x4x8", 256: "4x8x8", 512: "8x8x8"}
_2D_SHAPES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str        # as the user said it, e.g. "v5p-64"
  chip: Chip
  chips: int
  shape: str       # libtpu topology, e.g. "2x4x4"; GPUs: slices x nodes x GPUs per node, e.g. "1x2x8"

  @property
  def topology_name(self) -> str:
    return f"{self.chip.name}:{self.shape}"

  @property
  def nodes(self) -> int:
    """Hosts joined by the network (GPUs; a TPU slice's chips are all on its interconnect: 1)."""
    return -(-self.chips // GPUS_PER_NODE) if self.chip.platform == "gpu" else 1

  @property
  def devices_per_node(self) -> int:
    return self.chips // self.nodes


def parse(name: str) -> Slice:
  """`v5p-64` or `h100-8` -> Slice; UserError naming the known chips and sizes otherwise."""
  m = re.fullmatch(r"([a-z0-9]+)-(\d+)", name or "")
  if not m or m.group(1) not in CHIPS:
    raise UserError(f"config.compile.topology={name!r}: expected <chip>-<size> with chip one of "
                    f"{sorted(CHIPS)}, e.g. v5p-64, v5e-256, v6e-8 (TPU slices) or h100-8, h200-1, h100-16 "
                    "(NVIDIA GPUs: 1 to 8 on one node, more as nodes of 8)")
  chip, size = CHIPS[m.group(1)], int(m.group(2))
  if chip.platform == "gpu":
    if size not in _GPU_SIZES:
      raise UserError(f"config.compile.topology={name!r}: no {chip.name} target of that size; known sizes "
                      f"{list(_GPU_SIZES)} (GPUs; above {GPUS_PER_NODE}, nodes of {GPUS_PER_NODE})")
    nodes = -(-size // GPUS_PER_NODE)
    return Slice(name, chip, size, f"1x{nodes}x{size // nodes}")
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
  """The slice's abstract devices (no TPU or GPU needed). Needs libtpu, or for GPUs the CUDA plugin: a clear error
  when it is missing."""
  if slice_.chip.platform == "gpu":
    return _gpu_devices(slice_)
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # off Google Cloud: no metadata server to ask
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # no TPU is driven: another libtpu user may run
  from jax.experimental import topologies

  try:
    return list(topologies.get_topology_desc(topology_name=slice_.topology_name, platform="tpu").devices)
  except Exception as e:  # pylint: disable=broad-except  # libtpu missing or refusing the topology
    raise UserError(f"cannot describe TPU topology {slice_.topology_name} ({slice_.name}): {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}. --mode=compile needs libtpu: "
                    "pip install -r requirements-compile.txt") from None


def _gpu_devices(slice_: Slice):
  from jax.experimental import topologies

  target = gpu_targets.target_config(GPU_MODELS[slice_.chip.name])
  try:
    return list(topologies.get_topology_desc(platform="cuda", target_config=target, topology=slice_.shape).devices)
  except Exception as e:  # pylint: disable=broad-except  # the CUDA plugin missing or refusing the target
    raise UserError(f"cannot describe {slice_.chips} x {GPU_MODELS[slice_.chip.name].name} ({slice_.name}): "
                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. --mode=compile for GPUs needs "
                    "the CUDA plugin: pip install -r requirements-compile-gpu.txt") from None


def chip_of(mesh) -> Chip:
  """The chip of a mesh of TPU or GPU devices (abstract or real), by their `device_kind`."""
  kind = mesh.devices.flat[0].device_kind
  if kind not in DEVICE_KINDS:
    raise UserError(f"unknown device kind {kind!r}; known {sorted(DEVICE_KINDS)}")
  return CHIPS[DEVICE_KINDS[kind]]
