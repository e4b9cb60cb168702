"""LPIPS reward (VGG16, full size, random weights): time per image, jitted, compile excluded.

Scores `--batch` random uint8 images against random targets at each `--sizes` side, `--repeats`
times after one compiling call (reported separately), and prints the median per batch and per image.

    python bench/rewards_lpips.py --sizes=224,512 --batch=2 --repeats=3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import glmrl  # noqa: E402,F401  (first: disables flax eager sharding)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from glmrl.models.lpips import LPIPS, LPIPSConfig  # noqa: E402
from glmrl.rewards.lpips import make_lpips_reward  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="224,512", help="comma-separated image sides in pixels")
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]

  cfg = LPIPSConfig.full()
  # Random init under jit: one compiled program instead of hundreds of eager ops.
  graphdef, state = nnx.split(nnx.eval_shape(lambda: LPIPS(cfg, rngs=nnx.Rngs(0))))
  state = jax.jit(lambda: nnx.split(LPIPS(cfg, rngs=nnx.Rngs(0)))[1])()
  n_params = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(state))

  @jax.jit
  def score(state, images, target):
    reward = make_lpips_reward(nnx.merge(graphdef, state))
    return reward(images, None, {"target_image": target})

  print(f"device: {jax.devices()[0].platform} ({os.cpu_count()} cpus); LPIPS-VGG16 {n_params / 1e6:.2f}M params, "
        f"batch {args.batch}, {args.repeats} repeats")
  rng = np.random.default_rng(0)
  for side in sizes:
    images = rng.integers(0, 256, (args.batch, side, side, 3), dtype=np.uint8)
    target = rng.integers(0, 256, (args.batch, side, side, 3), dtype=np.uint8)
    t = time.perf_counter()
    jax.block_until_ready(score(state, images, target))
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(args.repeats):
      t = time.perf_counter()
      jax.block_until_ready(score(state, images, target))
      times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(f"{side}x{side}: first call {compile_s:.2f} s (compile + run), median {med:.3f} s per batch, "
          f"{med / args.batch:.3f} s per image")


if __name__ == "__main__":
  main()
