"""Timing shared by the benchmarks."""

import statistics
import time


def interleaved_medians(fns, reps: int, warmup: bool = False) -> list[float]:
  """Median wall time of each function, timed in alternation so that load from other processes on
  a shared machine falls on all of them alike (`warmup`: one untimed call each first, e.g. compilation)."""
  if warmup:
    for fn in fns:
      fn()
  times = [[] for _ in fns]
  for _ in range(reps):
    for fn, ts in zip(fns, times):
      t0 = time.perf_counter()
      fn()
      ts.append(time.perf_counter() - t0)
  return [statistics.median(ts) for ts in times]
