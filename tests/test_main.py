"""main.py rejects bad configs before any work starts, naming the key."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(*args, tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "main.py"), f"--workdir={tmp_path}", *args]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("override,message", [
    ("--config.grpo.nope=1", "unknown config key 'nope' in --config.grpo.nope=1"),
    ("--config.grpo.group_size=abc", "--config.grpo.group_size=abc: invalid literal for int()"),
    ("--config.grpo.group_size=1", "config.grpo.group_size=1: must be at least 2"),
    ("--config.data.width=100", "config.data.width=100: must be a positive multiple of 32"),
    ("--config.model.param_dtype=float16", "config.model.param_dtype='float16'"),
])
def test_bad_config_fails_naming_the_key(override, message, tmp_path):
  result = run_main("--config=configs/demo.py", override, tmp_path=tmp_path)
  assert result.returncode != 0
  assert message in result.stderr + result.stdout
  assert not os.listdir(tmp_path)  # nothing was started


def test_unknown_mode(tmp_path):
  result = run_main("--mode=fly", tmp_path=tmp_path)
  assert result.returncode != 0 and "--mode" in result.stderr
