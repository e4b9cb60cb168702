"""This process's devices' memory, as the backend reports it (`Device.memory_stats`): their size, for the `auto`
choices, and the peak in use, logged with every step. Host (CPU) devices report none."""

from __future__ import annotations

import os

import jax


def _stats(device) -> dict:
  try:
    return device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except  # backends without memory statistics
    return {}


def limit_bytes() -> int:
  """Memory of one of this process's devices: the accelerator's own limit, or for host (CPU) devices the
  machine's RAM shared by them."""
  limit = _stats(jax.local_devices()[0]).get("bytes_limit")
  if limit:
    return int(limit)
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // jax.local_device_count()


def peak_bytes() -> int | None:
  """The largest peak in use of this process's devices since they started; None where the backend keeps none."""
  peaks = [_stats(d).get("peak_bytes_in_use") for d in jax.local_devices()]
  peaks = [p for p in peaks if p is not None]
  return int(max(peaks)) if peaks else None
