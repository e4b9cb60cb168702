"""A served reward scored while the decoder runs (`rollout.overlap_rewards`) against scoring after the whole decode,
side by side in one run: the demo (16 images a step) decoded in calls of `--decode_batch` images, with a served
reward whose server answers each request after a fixed `--latency_s` (one request at a time: the reference server's
default `--workers=1`), one request per decoder call (`chunk_size` = `--decode_batch`).

    python bench/reward_overlap.py [--steps=6] [--decode_batch=2] [--latency_s=0.25] [--dit_steps=N]

(`--dit_steps`: the decoder's denoising steps, to make a decoder call cost about what a request does.)

Each setting trains the same seeded run in its own main.py process (alternating, `--repeats` times); a step's figures
are the medians over its steps after the first (which compiles). Prints per setting: time/step, time/decode,
time/reward (the decode's end until the rewards and advantages are on device), time/reward_wait (of it, the wait for
the served reward) and time/reward/remote (the reward's own seconds), and the bound the overlap can reach: the served
reward's last request starts when both the decode and the requests before it are done, so the wait after the decode
is at least max(one request, all requests - the decode after the first call).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LATENCY_ENV = "GLMRL_BENCH_REWARD_LATENCY_S"
KEYS = ("time/step", "time/decode", "time/reward", "time/reward_wait", "time/reward/remote")


def slow_brightness(images, prompts, metadata):
  """The reference server's scorer: each image's mean brightness, answered after the fixed latency."""
  del prompts, metadata
  time.sleep(float(os.environ[LATENCY_ENV]))
  return [float(np.asarray(im, np.float32).mean() / 255.0) for im in images]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _serve(latency_s: float):
  port = _free_port()
  server = subprocess.Popen([sys.executable, "-m", "glmrl.rewards.server", "--scorer=bench.reward_overlap:slow_brightness",
                             f"--port={port}"], cwd=ROOT, env={**os.environ, LATENCY_ENV: str(latency_s)},
                            stderr=subprocess.DEVNULL)
  deadline = time.time() + 60
  while time.time() < deadline:
    with socket.socket() as s:
      if s.connect_ex(("127.0.0.1", port)) == 0:
        return server, f"http://127.0.0.1:{port}/score"
    time.sleep(0.2)
  server.kill()
  raise RuntimeError("the reward server did not start")


def _train(url: str, overlap: bool, args) -> list[dict]:
  with tempfile.TemporaryDirectory() as workdir:
    served = (f"{{'name': 'remote', 'weight': 1.0, 'kwargs': {{'url': '{url}', 'chunk_size': {args.decode_batch}, "
              f"'retries': 0}}}}")
    cmd = [sys.executable, "main.py", f"--workdir={workdir}", "--config=configs/demo.py",
           f"--config.train.num_steps={args.steps}", f"--config.checkpoint.save_interval={args.steps}",
           "--config.log.image_interval=0", f"--config.sampling.decode_batch={args.decode_batch}",
           *([f"--config.sampling.dit_steps={args.dit_steps}"] if args.dit_steps else []),
           f"--config.rewards=({served},)", f"--config.rollout.overlap_rewards={overlap}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
      raise RuntimeError(done.stderr[-3000:])
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      return [json.loads(line) for line in f]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--decode_batch", type=int, default=2)
  parser.add_argument("--latency_s", type=float, default=0.25)
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--dit_steps", type=int, default=0, help="0: the demo's")
  args = parser.parse_args()
  server, url = _serve(args.latency_s)
  try:
    steps = {False: [], True: []}
    for _ in range(args.repeats):
      for overlap in (False, True):
        steps[overlap] += _train(url, overlap, args)[1:]
  finally:
    server.kill()
  calls = 16 // args.decode_batch
  print(f"demo{f' at {args.dit_steps} DiT steps' if args.dit_steps else ''}, 16 images in {calls} decoder calls of "
        f"{args.decode_batch}; a served reward answering each call's request after {args.latency_s} s; "
        f"{len(steps[False])} steps each (medians, seconds); both settings in processes of the same machine")
  print("| setting | " + " | ".join(KEYS) + " |")
  print("| --- |" + " --- |" * len(KEYS))
  medians = {}
  for overlap, rows in steps.items():
    medians[overlap] = {k: statistics.median(r[k] for r in rows) for k in KEYS}
    print(f"| overlap_rewards={overlap} | " + " | ".join(f"{medians[overlap][k]:.3f}" for k in KEYS) + " |")
  serial, over = medians[False], medians[True]
  requests = serial["time/reward/remote"]
  bound = max(requests / calls, requests - over["time/decode"] * (calls - 1) / calls)
  print(f"step time overlapped / serial: {over['time/step'] / serial['time/step']:.3f}; wait after the decode "
        f"{over['time/reward_wait']:.3f} s against a bound of {bound:.3f} s (serial {serial['time/reward_wait']:.3f} s)")


if __name__ == "__main__":
  main()
