"""Start-to-first-step of the demo, as a user runs it: `main.py --config=configs/demo.py`, one step, a fresh workdir.

    python bench/startup.py [--roots=.,/path/to/an/older/checkout] [--repeats=2] [--cache]

For each checkout (a git worktree of another commit compares before/after), runs the command `--repeats` times,
alternating between checkouts, and prints the median seconds from process start to:
  setup   the "compiling the rollout" line (imports, checks, random tiny models built, programs not yet compiled)
  step 1  the first progress line (its rollout and update compiled and run)
  exit    the process's end (checkpoint saved, summary printed)
No persistent compilation cache is used unless --cache (then one warm-up run fills a fresh cache first and the
timed runs reuse it: what a user's second start costs with JAX_COMPILATION_CACHE_DIR set).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(root: str, cache_dir: str | None) -> dict[str, float]:
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  if cache_dir:
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, "main.py", "--config=configs/demo.py", f"--workdir={workdir}",
           "--config.train.num_steps=1"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = {}
    for line in proc.stderr:
      if "setup" not in out and "compiling the rollout" in line:
        out["setup"] = time.perf_counter() - start
      if "step 1" not in out and line.startswith("step 1/"):
        out["step 1"] = time.perf_counter() - start
    proc.wait()
    out["exit"] = time.perf_counter() - start
    if proc.returncode:
      raise SystemExit(f"{root}: {' '.join(cmd)} exited {proc.returncode}")
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--roots", default=HERE, help="comma-separated checkouts to time")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--cache", action="store_true", help="time warm starts from a persistent compilation cache")
  args = parser.parse_args()
  roots = [os.path.abspath(r) for r in args.roots.split(",")]
  caches = {r: tempfile.mkdtemp(prefix="glmrl_startup_cache_") if args.cache else None for r in roots}
  if args.cache:
    for r in roots:
      run_once(r, caches[r])
  times = {r: [] for r in roots}
  for _ in range(args.repeats):
    for r in roots:
      times[r].append(run_once(r, caches[r]))
  print(f"threads: XLA's default on {os.cpu_count()} cores; cache: {'warm' if args.cache else 'none'}; "
        f"median of {args.repeats}")
  print("| checkout | setup (s) | step 1 (s) | exit (s) |\n| --- | ---: | ---: | ---: |")
  for r in roots:
    med = {k: statistics.median(t[k] for t in times[r]) for k in ("setup", "step 1", "exit")}
    print(f"| {r} | {med['setup']:.1f} | {med['step 1']:.1f} | {med['exit']:.1f} |")


if __name__ == "__main__":
  main()
