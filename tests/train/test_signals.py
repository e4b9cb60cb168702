"""SIGTERM during training saves a checkpoint of the last finished step and exits with 143 (SIGHUP, a closed
terminal, likewise with 129); a second signal is answered with one line and the save goes on, a third aborts
without a traceback, the lock released; before any step has finished, a signal exits at once."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.train.common import ROOT


def _training(tmp_path):
  """main.py on the demo, 1000 steps without a periodic save, once two steps are logged (the run has work to
  save)."""
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
  return proc, metrics


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_saves_the_step_and_exits_a_second_one_only_says_so(tmp_path, first):
  proc, metrics = _training(tmp_path)
  proc.send_signal(first)
  time.sleep(0.2)  # the first is the run's flag; the second arrives while it finishes the step and saves
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 128 + first.value, stderr[-3000:]  # 143 for SIGTERM: a scheduler sees a preemption
  assert f"{first.name} received: saving a checkpoint after the current step" in stderr
  assert stderr.count("SIGTERM received again: already finishing the step to save it; a third signal aborts "
                      "without saving\n") == 1, stderr[-3000:]
  assert "Traceback" not in stderr
  last_step = json.loads(metrics.read_text().splitlines()[-1])["step"]
  steps = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
  assert steps and steps[-1] == last_step  # the interrupted run's last step is saved (interval was 1000)
  assert last_step < 1000
  assert not (tmp_path / "lock.json").exists()


def test_a_third_signal_aborts_at_once_without_a_traceback(tmp_path):
  proc, _ = _training(tmp_path)
  lines = []
  reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
  reader.start()
  for _ in range(3):
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
  proc.wait(timeout=60)
  reader.join(timeout=10)
  assert proc.returncode == 130, "".join(lines)[-3000:]
  assert lines[-1] == "SIGINT received: signal 3 since the step in flight: aborting without saving it; exiting\n", \
      lines[-3:]
  assert not any("Traceback" in l or "KeyboardInterrupt" in l for l in lines)
  assert not (tmp_path / "lock.json").exists()


def _start(tmp_path, *flags):
  cmd = [sys.executable, os.path.join(ROOT, "main.py"), "--config=configs/demo.py", f"--workdir={tmp_path}",
         "--config.log.image_interval=0", *flags]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  lines = []
  threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
  return proc, lines


def _stop_and_time(proc, sig) -> float:
  sent = time.time()
  proc.send_signal(sig)
  proc.wait(timeout=60)
  return time.time() - sent


@pytest.mark.parametrize("sig,status,phase", [(signal.SIGINT, 130, "setup"), (signal.SIGTERM, 143, "compile")])
def test_a_signal_before_any_step_finished_exits_within_seconds(tmp_path, sig, status, phase):
  """While nothing is unsaved (models being built; the first step compiling), SIGTERM and Ctrl-C end the run
  at once, even with the main thread inside XLA, with one line, the lock released, nothing saved and the workdir
  as the run found it (here: none, so none is left)."""
  work = tmp_path / "run"
  proc, lines = _start(work, "--config.train.num_steps=3")
  deadline = time.time() + 300
  lock = work / "lock.json"
  ready = (lambda: lock.exists()) if phase == "setup" else (lambda: any("compiling the rollout" in l for l in lines))
  while time.time() < deadline and proc.poll() is None and not ready():
    time.sleep(0.05)
  assert proc.poll() is None, "".join(lines)[-3000:]
  took = _stop_and_time(proc, sig)
  assert proc.returncode == status, "".join(lines)[-3000:]
  assert took < 5, f"{took:.1f} s to exit"
  time.sleep(0.2)  # the reader thread's last lines
  assert lines[-1] == f"{sig.name} received: nothing new to save (no step finished yet); exiting\n", lines[-3:]
  assert not any("Traceback" in l for l in lines)
  assert not work.exists(), sorted(os.listdir(work))  # no lock, no step, no records, event files or logs
