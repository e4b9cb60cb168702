"""What the per-step stop decision of a multi-process run costs (`glmrl.runtime.agreement.stop_signal`, one
exchange through JAX's coordination service after every step): two processes on this host, set up as main.py sets
them up, each timing `--calls` decisions back to back; prints each process's median and 99th percentile in milliseconds.

    python bench/stop_exchange.py [--calls=500]

The demo's step takes seconds (2 processes x 4 host devices); a pod step of a released recipe, tens of seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _process(process_id: int, port: int, calls: int) -> None:
  sys.path.insert(0, HERE)
  import numpy as np  # pylint: disable=import-outside-toplevel

  from glmrl.runtime import agreement, distributed  # pylint: disable=import-outside-toplevel

  distributed.initialize(f"localhost:{port}", 2, process_id)
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    agreement.stop_signal(None)
    times.append(time.perf_counter() - start)
  distributed.finished()
  print(json.dumps({"median_ms": 1e3 * float(np.median(times)), "p99_ms": 1e3 * float(np.percentile(times, 99))}))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=500)
  args = parser.parse_args()
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
  procs = [subprocess.Popen([sys.executable, __file__, "--process", str(i), str(port), str(args.calls)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i in range(2)]
  for i, proc in enumerate(procs):
    out, _ = proc.communicate(timeout=600)
    got = json.loads(out.strip().splitlines()[-1])
    print(f"process {i}: {args.calls} stop decisions, median {got['median_ms']:.2f} ms, p99 {got['p99_ms']:.2f} ms")


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] == "--process":
    _process(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
  else:
    main()
