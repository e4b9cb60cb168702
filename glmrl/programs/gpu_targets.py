"""NVIDIA GPUs described for XLA without one attached: the `GpuTargetConfigProto` text that
`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)` compiles for.

XLA:GPU compiles for the device its target config describes (compute capability, SM count, shared memory and
register limits pick the kernels and tilings; the memory size and bandwidths feed its cost model and scheduler).
The text is written here from each GPU's published properties (what `cudaGetDeviceProperties` and NVIDIA's data
sheets give for it), in the fields jaxlib 0.10.2's parser reads. The cuDNN version it names is the oldest the
pinned `jax-cuda12-plugin` accepts (`nvidia-cudnn-cu12>=9.8`), so XLA uses no cuDNN feature a supported GPU
install lacks; the graphs themselves are built by the cuDNN requirements-compile-gpu.txt installs.
"""

from __future__ import annotations

import dataclasses

# XLA PrimitiveType numbers -> (SM units, operations per clock per unit) of Hopper's scalar pipes and its tensor
# cores (H100 and H200 share the GH100 die). Numbers: S32 4, U32 8, F16 10, F32 11, F64 12, BF16 16, S8 2, U8 6,
# and the 8-bit floats F8E5M2 19, F8E4M3FN 20, F8E4M3B11FNUZ 23, F8E5M2FNUZ 24, F8E4M3FNUZ 25, F8E4M3 28, F8E3M4 29,
# F8E8M0FNU 33, F4E2M1FN 35 (counted as 8-bit on Hopper), S4 36.
_HOPPER_SCALAR = {4: (64, 1), 8: (64, 1), 10: (128, 2), 11: (128, 1), 12: (64, 1), 16: (128, 2)}
_HOPPER_TENSOR = {2: 1024, 6: 1024, 10: 512, 11: 256, 12: 32, 16: 512, 19: 1024, 20: 1024, 23: 1024, 24: 1024,
                  25: 1024, 28: 1024, 29: 1024, 33: 1024, 35: 1024, 36: 1024}
_HOPPER_SM_CLOCK_GHZ = 1.98        # boost clock of the SMs
_HOPPER_TENSOR_CLOCK_GHZ = 1.8295201  # the clock the tensor cores sustain (989 TFLOP/s dense BF16 over 132 SMs)
_FP64_TENSOR_CLOCK_GHZ = 1.98      # FP64 tensor-core ops run at the SM clock


@dataclasses.dataclass(frozen=True)
class GpuModel:
  """One GPU model's properties, as the device reports them."""
  name: str                 # `cudaDeviceProp.name`, what `device_kind` says on the real GPU
  memory_bytes: int         # `totalGlobalMem`
  memory_bandwidth: int     # bytes per second
  memory_clock_khz: int
  core_count: int = 132     # SMs
  l2_cache_bytes: int = 50 * 2**20
  compute_capability: tuple = (9, 0)
  nvlink_links: int = 18
  cudnn: tuple = (9, 8, 0)  # the cuDNN version XLA may assume (see the module doc)


H100_SXM = GpuModel("NVIDIA H100 80GB HBM3", 84942979072, 3352320000000, 2619000)
H200 = GpuModel("NVIDIA H200 141GB HBM3e", 151397597184, 4800000000000, 3750000)


def _rates(table: dict, clock: float, units: int | None = None) -> str:
  rows = []
  for key, value in table.items():
    per_unit = value if units is not None else value[1]
    n = units if units is not None else value[0]
    tensor_clock = _FP64_TENSOR_CLOCK_GHZ if (units is not None and key == 12) else clock
    rows.append(f"    rate_infos {{ key: {key} value {{ clock_rate_ghz: {tensor_clock} units_per_core: {n} "
                f"ops_per_clock: {per_unit} }} }}")
  return "\n".join(rows)


def target_config(gpu: GpuModel) -> str:
  """The `GpuTargetConfigProto` text of `gpu` (see the module doc)."""
  major, minor = gpu.compute_capability
  cudnn = ".".join(map(str, gpu.cudnn))
  clock_khz = int(_HOPPER_SM_CLOCK_GHZ * 1e6)
  model = (f"sm_{major}.{minor}a with {gpu.memory_bytes}B RAM, {gpu.core_count} cores, {clock_khz}KHz clock, "
           f"{gpu.memory_clock_khz}KHz mem clock, {gpu.l2_cache_bytes}B L2$")
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  shared_memory_per_block_optin: 232448
  threads_per_core_limit: 2048
  core_count: {gpu.core_count}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  memory_bandwidth: {gpu.memory_bandwidth}
  l2_cache_size: {gpu.l2_cache_bytes}
  clock_rate_ghz: {_HOPPER_SM_CLOCK_GHZ}
  device_memory_size: {gpu.memory_bytes}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  cuda_compute_capability {{ major: {major} minor: {minor} feature_extension: ACCELERATED_FEATURES }}
  scalar_unit_description {{
{_rates(_HOPPER_SCALAR, _HOPPER_SM_CLOCK_GHZ)}
  }}
  matrix_unit_description {{
{_rates(_HOPPER_TENSOR, _HOPPER_TENSOR_CLOCK_GHZ, units=4)}
  }}
  device_vendor: "NVIDIA Corporation"
  platform_version: "Compute Capability {major}.{minor}a"
  model_str: "{model}"
  device_address_bits: 64
  pcie_bandwidth: 34359738368
  ecc_enabled: true
  name: "{gpu.name}"
  dnn_version: "{cudnn}"
  device_interconnect_info {{ active_links: {gpu.nvlink_links} }}
}}
platform_name: "CUDA"
dnn_version_info {{ major: {gpu.cudnn[0]} minor: {gpu.cudnn[1]} patch: {gpu.cudnn[2]} }}
device_description_str: "{gpu.name}"
"""
