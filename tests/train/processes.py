"""main.py launched as users launch it on a pod: N processes of D host devices each (gloo over loopback), or one
process on all the devices, and the per-step metrics they log."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from tests.test_main import ROOT


def env(devices: int) -> dict:
  return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def command(workdir, *flags) -> list:
  return [sys.executable, os.path.join(ROOT, "main.py"), f"--workdir={workdir}", *flags]


def launch(workdir, *flags, processes: int = 2, devices: int = 4, timeout: int = 600) -> list[str]:
  """main.py as `processes` processes of `devices` host devices each (one process: no coordinator); asserts each
  exits 0 and returns their stderr."""
  if processes == 1:
    result = subprocess.run(command(workdir, *flags), env=env(devices), cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return [result.stderr]
  port = free_port()
  procs = [subprocess.Popen(command(workdir, *flags, f"--coordinator_address=localhost:{port}",
                                    f"--num_processes={processes}", f"--process_id={i}"),
                            env=env(devices), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(processes)]
  errs = []
  try:
    for i, p in enumerate(procs):
      _, err = p.communicate(timeout=timeout)
      assert p.returncode == 0, f"process {i}: {err[-3000:]}"
      errs.append(err)
  finally:
    for p in procs:
      p.kill()
  return errs


def rows(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def assert_same_metrics(got: list[dict], want: list[dict], keys, rtol_first: float, rtol: float, atol: float = 1e-6):
  """The same logged steps, and each of `keys` (present in `want`) equal within `rtol_first` relative at step 1
  (the same initial parameters) and `rtol` after updates; every first update on-policy (ratio exactly 1)."""
  assert [r["step"] for r in got] == [r["step"] for r in want]
  for a, b in zip(got, want):
    compared = [k for k in b if any(k == p or k.startswith(p + "/") for p in keys)]
    assert compared, f"none of {keys} logged"
    for k in compared:
      # The JPEG size jumps by bytes when one pixel rounds the other way (tests/train/test_multihost.py).
      tol = 1e-3 if "jpeg" in k else (rtol_first if a["step"] == 1 else rtol)
      np.testing.assert_allclose(a[k], b[k], rtol=tol, atol=atol, err_msg=f"step {a['step']} {k}")
    for k in (k for k in a if k.endswith("first_iter/ratio/min") or k.endswith("first_iter/ratio/max")):
      assert a[k] == 1.0, (a["step"], k, a[k])
