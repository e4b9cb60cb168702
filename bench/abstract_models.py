"""Building GLM-Image's components abstractly (`nnx.eval_shape`, no memory): keys drawn from `nnx.Rngs` against
`glmrl.models.init_rngs.InitRngs` (the same keys, counted in Python), side by side in one process.

    python bench/abstract_models.py [--preset=full] [--repeats=3]

Prints, per component, the parameter count and the median seconds of `--repeats` builds with each, and their
ratio. Every `--mode=compile`, conversion and training start builds its components this way at least once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import glmrl  # noqa: E402,F401  (first: its JAX settings)

import jax  # noqa: E402
from flax import nnx  # noqa: E402

from glmrl.models import glm_image  # noqa: E402
from glmrl.models.init_rngs import InitRngs  # noqa: E402


def seconds(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="full", choices=["tiny", "full"])
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  configs = glm_image.preset_configs(args.preset)
  print(f"jax {jax.__version__}, {args.preset} preset, median of {args.repeats}")
  print("| component | parameters | nnx.Rngs s | InitRngs s | ratio |")
  print("| --- | --- | --- | --- | --- |")
  for name, (_, cls) in glm_image.COMPONENTS.items():
    cfg = getattr(configs, name)
    build = lambda rngs: nnx.eval_shape(lambda: cls(cfg, rngs=rngs(0)))
    leaves = len(jax.tree.leaves(nnx.state(build(InitRngs), nnx.Param)))
    ours, theirs = seconds(lambda: build(InitRngs), args.repeats), seconds(lambda: build(nnx.Rngs), args.repeats)
    print(f"| {name} | {leaves} | {theirs:.2f} | {ours:.2f} | {theirs / ours:.1f}x |", flush=True)


if __name__ == "__main__":
  main()
