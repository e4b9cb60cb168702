"""What W&B logging adds to a step: the run writer's per-step work (the demo's scalars every step, its sample grid
every `--image_interval` steps) with TensorBoard alone against TensorBoard plus W&B, both offline, on this host.

    python bench/wandb_logging.py [--steps=60] [--image_interval=10] [--repeats=5]

Each repeat writes `--steps` steps into a fresh folder with each writer, the two alternating, and prints the median
milliseconds per step of each and their ratio. Opening and closing the W&B run (its service process start, its final
sync of the files) are timed apart: they happen once per run, not per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import demo  # noqa: E402
from glmrl.logging import run_writer  # noqa: E402

# The demo's step-1 row: 60 scalars, and a grid of 2 prompts x 8 images of 64 x 64.
SCALARS = {f"metric_{i}": float(i) for i in range(60)}
IMAGES = np.random.default_rng(0).integers(0, 256, (16, 64, 64, 3), np.uint8)


def steps(writer, count: int, image_interval: int) -> None:
  for step in range(1, count + 1):
    writer.write_scalars(step, SCALARS)
    if step % image_interval == 0 or step == 1:
      writer.write_samples(step, IMAGES, ["a prompt"] * 16, np.zeros(16), tag="train_samples", ncols=8)


def one_run(root: str, name: str, config, args) -> tuple[float, float, float]:
  """(seconds opening the writer, seconds of the steps, seconds closing it) in a fresh folder."""
  workdir = tempfile.mkdtemp(prefix=name, dir=root)
  t0 = time.perf_counter()
  writer = run_writer(workdir, config)
  t1 = time.perf_counter()
  steps(writer, args.steps, args.image_interval)
  t2 = time.perf_counter()
  writer.close()
  return t1 - t0, t2 - t1, time.perf_counter() - t2


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--steps", type=int, default=60)
  p.add_argument("--image_interval", type=int, default=10)
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args()
  plain, logged = demo.get_config(), demo.get_config()
  logged.log.wandb, logged.log.wandb_mode = True, "offline"
  configs = {"tensorboard": plain, "tensorboard+wandb": logged}
  root = tempfile.mkdtemp()
  for name, config in configs.items():  # warm-up: imports, W&B's service start
    one_run(root, name, config, args)
  # Alternating, so that load from other processes falls on both alike.
  times = {name: [] for name in configs}
  for _ in range(args.repeats):
    for name, config in configs.items():
      times[name].append(one_run(root, name, config, args))
  print(f"{args.steps} steps, a grid every {args.image_interval}; medians of {args.repeats} runs, one process "
        "(its default threads) for both")
  per_step = {}
  for name, runs in times.items():
    opened, stepped, closed = (statistics.median(column) for column in zip(*runs))
    per_step[name] = stepped / args.steps
    print(f"  {name:18s} {1e3 * per_step[name]:7.2f} ms/step   open {opened:.2f} s   close {closed:.2f} s")
  print(f"  per-step ratio (W&B on / off) {per_step['tensorboard+wandb'] / per_step['tensorboard']:.2f}")


if __name__ == "__main__":
  main()
