"""The decoder-RL algorithms side by side on the decoder demo, as users run them:
`main.py --config=configs/demo_decoder.py:<variant>` for flow_grpo, cps (Flow-GRPO with CPS steps, CFG-free), guard
(GRPO-Guard's ratio, MixGRPO's sliding window), nft, awm (as released) and dgpo, one after the other on the same machine, each 30 steps of the same tiny model, reward and seed.

    python bench/decoder_algorithms.py [--out=docs/decoder_algorithms.png] [--threads=N] [--variants=nft,awm]

Prints per variant: wall time of the run (process start to end), seconds of its 30 steps (their `time/step`
summed: rollout, reward and update, the first step's compilation included), the mean reward of the first and the
last quarter of the steps and Welch's t of that rise (pooled std of the two quarters), and draws the reward
against the steps' cumulative seconds (`glmrl.logging.plot.plot_series`). `--threads` pins XLA's CPU thread pool
(XLA_FLAGS intra-op threads) for every run; by default each run uses every core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from bench import threads as bench_threads  # noqa: E402
from glmrl.logging.plot import plot_series  # noqa: E402

VARIANTS = {"flow_grpo": "flow_grpo", "flow_grpo + cps, CFG-free": "cps",
            "flow_grpo + GRPO-Guard, sliding window": "guard", "nft": "nft", "awm (as released)": "awm",
            "dgpo": "dgpo"}
REWARD = "decoder/reward/mean"


def rise_t(values: list[float]) -> tuple[float, float, float]:
  """(first quarter's mean, last quarter's mean, t of the difference with the quarters' pooled std)."""
  q = len(values) // 4
  a, b = values[:q], values[-q:]
  ma, mb = sum(a) / q, sum(b) / q
  var = lambda xs, m: sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
  pooled = math.sqrt((var(a, ma) + var(b, mb)) / 2)
  return ma, mb, (mb - ma) / (pooled * math.sqrt(2 / q))


def run(variant: str, threads: int | None) -> dict:
  env, pin = bench_threads.for_child(threads or 0, dict(os.environ))
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "main.py", f"--config=configs/demo_decoder.py:{variant}",
                          f"--workdir={workdir}"], cwd=HERE, env=env, capture_output=True, text=True,
                         preexec_fn=pin)
    wall = time.perf_counter() - start
    if out.returncode:
      raise SystemExit(f"{variant}: exit {out.returncode}\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  seconds, clock = [], 0.0
  for r in rows:
    clock += r["time/step"]
    seconds.append(clock)
  rewards = [r[REWARD] for r in rows]
  return {"wall": wall, "seconds": seconds, "rewards": rewards, "steps": len(rows)}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=os.path.join(HERE, "docs", "decoder_algorithms.png"))
  p.add_argument("--threads", type=int, default=None)
  p.add_argument("--variants", default=",".join(VARIANTS.values()), help="comma-separated demo variants to run")
  args = p.parse_args()
  chosen = args.variants.split(",")
  print(f"threads: {args.threads or 'all cores (XLA default)'}; {os.cpu_count()} cores")
  print("| variant | steps | run wall s | steps s | reward, first quarter | last quarter | t |")
  print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
  series = {}
  for label, variant in VARIANTS.items():
    if variant not in chosen:
      continue
    r = run(variant, args.threads)
    first, last, t = rise_t(r["rewards"])
    print(f"| {label} | {r['steps']} | {r['wall']:.1f} | {r['seconds'][-1]:.1f} | {first:.4f} | {last:.4f} | "
          f"{t:.2f} |", flush=True)
    series[label] = (r["seconds"], r["rewards"])
  print(plot_series(series, args.out, xlabel="seconds (steps' time, compilation included)", ylabel="reward (mean)",
                    title="decoder demo: saturation reward, 30 steps each"))


if __name__ == "__main__":
  main()
