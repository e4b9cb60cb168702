"""The base fingerprint a LoRA checkpoint records: the same on any mesh, another for any changed bit."""

import pathlib
import subprocess
import sys

from tests.cli import TIMEOUT_S

ROOT = pathlib.Path(__file__).parents[2]


def test_same_on_one_and_eight_devices_and_changed_by_any_bit():
  # 8 host devices need XLA_FLAGS before jax starts: a subprocess (tests/checkpoint/fingerprint_script.py).
  result = subprocess.run([sys.executable, "-m", "tests.checkpoint.fingerprint_script"], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith("ok"), result.stdout
