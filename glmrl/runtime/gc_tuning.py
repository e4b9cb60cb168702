"""Python's cyclic garbage collector, set for a process that traces JAX programs.

Tracing and lowering allocate Python objects by the million (tracers, jaxpr equations, MLIR wrappers), nearly all of
them freed by reference counting alone; at Python's default thresholds (a young-generation collection every 700 net
allocations) the collector still walks them over and over. A young collection every 10,000 net allocations spends a
fraction of that time at the same peak memory (the figures: docs/benchmarks.md, "Measurements behind the library's
defaults").
"""

import gc

# Young-generation threshold; the older generations keep Python's factors (10 young collections per middle one,
# 10 middle per full one), so a cycle holding device buffers still goes within about a million allocations.
YOUNG_THRESHOLD = 10_000


def for_tracing() -> None:
  """Collect the youngest generation every YOUNG_THRESHOLD net allocations (Python's default: 700), or less often
  where the process already asked for that."""
  young, middle, old = gc.get_threshold()
  gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
