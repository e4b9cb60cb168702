"""Start-to-first-step of the demo, as a user runs it: `main.py --config=configs/demo.py`, one step, a fresh workdir,
with a cold and a warm persistent compilation cache (main.py's default cache, here in a folder of the bench's own).

    python bench/startup.py [--roots=.,/path/to/an/older/checkout] [--repeats=2]

For each checkout (a git worktree of another commit compares before/after), runs the command `--repeats` times
cold (a new, empty cache folder each time: a first run) and `--repeats` times warm (the folder a first run filled:
a second run, a resume, eval or generate of the same config), alternating between checkouts, and prints the median
seconds from process start to:
  setup   the "compiling the rollout" line (imports, checks, random tiny models built, programs not yet compiled)
  step 1  the first progress line (its rollout and update compiled, or loaded, and run)
  exit    the process's end (checkpoint saved, summary printed)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(root: str, cache_dir: str) -> dict[str, float]:
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, "main.py", "--config=configs/demo.py", f"--workdir={workdir}",
           "--config.train.num_steps=1", f"--compilation_cache={cache_dir}"]
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
  args = parser.parse_args()
  roots = [os.path.abspath(r) for r in args.roots.split(",")]
  warm = {r: tempfile.mkdtemp(prefix="glmrl_startup_cache_") for r in roots}
  for r in roots:
    run_once(r, warm[r])  # fills the warm cache
  times = {(r, c): [] for r in roots for c in ("cold", "warm")}
  for _ in range(args.repeats):
    for r in roots:
      with tempfile.TemporaryDirectory(prefix="glmrl_startup_cold_") as cold:
        times[(r, "cold")].append(run_once(r, cold))
      times[(r, "warm")].append(run_once(r, warm[r]))
  for r in roots:
    shutil.rmtree(warm[r], ignore_errors=True)
  print(f"threads: XLA's default on {os.cpu_count()} cores; median of {args.repeats}")
  print("| checkout | cache | setup (s) | step 1 (s) | exit (s) |\n| --- | --- | ---: | ---: | ---: |")
  for (r, cache), runs in times.items():
    med = {k: statistics.median(t[k] for t in runs) for k in ("setup", "step 1", "exit")}
    print(f"| {r} | {cache} | {med['setup']:.1f} | {med['step 1']:.1f} | {med['exit']:.1f} |")


if __name__ == "__main__":
  main()
