"""What of a chip's memory a run's programs may use: the fit verdict's budget.

A TPU program may use the chip's HBM: XLA places everything the chip holds. On an NVIDIA GPU, JAX's client
preallocates a pool of `XLA_PYTHON_CLIENT_MEM_FRACTION` of the GPU's memory (0.75 unless set) and XLA's buffers
come from it; the compiler's figures (`memory_analysis`: arguments, outputs, temporaries, which hold the cuBLAS
and cuDNN workspaces XLA assigns) are all in that pool. Two things are not counted by the compiler, and the
budget holds a stated reserve for each:
- inside the pool: the allocator's fragmentation and the arrays the run keeps between programs (RNG keys, metrics,
  the batch being fed): `POOL_RESERVE_BYTES`;
- outside it: the CUDA context with its loaded modules (XLA's kernels, cuBLAS, cuDNN), and NCCL's buffers of each
  communicator: `OUTSIDE_POOL_BYTES`, which bounds how far the fraction may be raised.
"""

from __future__ import annotations

import dataclasses
import math
import os

from glmrl.errors import UserError

FRACTION_VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"
DEFAULT_FRACTION = 0.75  # JAX's default for it (jax docs: GPU memory allocation)
POOL_RESERVE_BYTES = 2 * 2**30
OUTSIDE_POOL_BYTES = 3 * 2**30


@dataclasses.dataclass(frozen=True)
class Budget:
  """Per-chip memory a step's programs may peak at (`bytes`), and where the figure comes from."""
  hbm_bytes: int
  bytes: int
  fraction: float | None = None  # GPUs: the allocator's pool fraction the verdict assumes
  fraction_source: str = ""      # "default" or the variable's value as set when the report was made

  def report(self, peak: int) -> dict:
    """The compile report's `memory_budget` entry for a step peaking at `peak` bytes per chip."""
    out = {"hbm_bytes": self.hbm_bytes, "budget_bytes": self.bytes}
    if self.fraction is None:
      return out
    needed = math.ceil(100 * (peak + POOL_RESERVE_BYTES) / self.hbm_bytes) / 100  # rounded up: enough
    out.update({
        "allocator_fraction": self.fraction, "allocator_fraction_source": self.fraction_source,
        "allocator_pool_bytes": int(self.fraction * self.hbm_bytes), "pool_reserve_bytes": POOL_RESERVE_BYTES,
        "outside_pool_bytes": OUTSIDE_POOL_BYTES, "max_fraction": round(max_fraction(self.hbm_bytes), 3),
        "fraction_needed": needed,
        "fits_with_raised_fraction": peak > self.bytes and needed <= max_fraction(self.hbm_bytes)})
    return out


def max_fraction(hbm_bytes: int) -> float:
  """The largest pool fraction that leaves `OUTSIDE_POOL_BYTES` outside the pool."""
  return 1.0 - OUTSIDE_POOL_BYTES / hbm_bytes


def fraction_from_environment() -> tuple[float, str]:
  """(the pool fraction, "default" or the variable's text); UserError for a value that is not in (0, 1]."""
  text = os.environ.get(FRACTION_VARIABLE)
  if text is None:
    return DEFAULT_FRACTION, "default"
  try:
    value = float(text)
  except ValueError:
    value = float("nan")
  if not 0.0 < value <= 1.0:
    raise UserError(f"{FRACTION_VARIABLE}={text!r}: must be a number in (0, 1], the share of each GPU's memory "
                    "JAX's allocator takes")
  return value, f"{FRACTION_VARIABLE}={text}"


def of(chip) -> Budget:
  """The budget of one `glmrl.programs.topology.Chip`: its HBM on TPUs; on GPUs the allocator's pool (the fraction
  as this process's environment sets it, else JAX's default) less `POOL_RESERVE_BYTES`."""
  if chip.platform != "gpu":
    return Budget(chip.hbm_bytes, chip.hbm_bytes)
  fraction, source = fraction_from_environment()
  return Budget(chip.hbm_bytes, int(fraction * chip.hbm_bytes) - POOL_RESERVE_BYTES, fraction, source)
