"""SIGTERM during training saves a checkpoint of the last finished step and exits with 143."""

import json
import os
import signal
import subprocess
import sys
import time

from tests.train.common import ROOT


def test_sigterm_saves_and_exits(tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "main.py"), "--config=configs/demo.py", f"--workdir={tmp_path}",
         "--config.train.num_steps=1000", "--config.checkpoint.save_interval=1000", "--config.log.image_interval=0"]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 400
  while time.time() < deadline and proc.poll() is None:
    if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
      break
    time.sleep(0.5)
  assert proc.poll() is None, proc.stderr.read()[-3000:]
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 143, stderr[-3000:]  # 128 + SIGTERM: a scheduler sees a preemption
  assert "SIGTERM received" in stderr
  last_step = json.loads(metrics.read_text().splitlines()[-1])["step"]
  steps = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
  assert steps and steps[-1] == last_step  # the interrupted run's last step is saved (interval was 1000)
  assert last_step < 1000
