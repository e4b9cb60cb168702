"""Python's cyclic garbage collector, set for a process that traces JAX programs.

Tracing and lowering allocate Python objects by the million (tracers, jaxpr equations, MLIR wrappers), nearly all of
them freed by reference counting alone; at Python's default thresholds (a young-generation collection every 700 net
allocations) the collector still walks them over and over: 7% of the demo's first three steps (1.3 s of 17.7 s,
cache off) and 16% of the policy and sampling tests in one process (12.5 s of ~78 s), by `gc.callbacks`. Every
10,000 net allocations, the same runs spent 0.3 s and 6.1 s in it, peak memory within 3% (1.21 against 1.18 GB
for the demo). The demo's three steps, three runs each way interleaved on 2 cores: 15.2-16.3 s against 16.0-17.2 s.
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
