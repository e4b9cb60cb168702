"""Faults of a pod run end and resume as one run: two main.py processes x 4 host devices (gloo over loopback),
launched as users launch them, against one process on 8 devices.

One chain on one workdir (each launch compiles its programs, the suite's costliest part): SIGTERM to process 1
alone (both save the same step and exit 143), a truncated file in that newest checkpoint (both resume from the
step before, one line says which step was set aside), kill -9 of process 1 during the next step (process 0 exits 1
with its line within the heartbeat bound), and a last restart that completes the run: its per-step metrics equal
the uninterrupted run's. Then the launch faults, before any model: a held workdir lock, a SIGTERM to one process of
`--mode=eval`, and facts that differ on a detected (SLURM-style) launch.
"""

import json
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from tests.checkpoint.test_restore_fallback import truncate_largest_params_file
from tests.train import test_multihost
from tests.cli import ROOT
from tests.train.processes import KEYS, assert_same_metrics, command, env, free_port, launch, rows

HEARTBEAT_S = 30  # two of JAX's heartbeats (one every half timeout): a busy CI host delays one
# The demo of tests/train/test_multihost.py, a checkpoint at every step and no sample grids, for 4 steps.
FLAGS = (*(f for f in test_multihost.FLAGS if not f.startswith(("--config.checkpoint", "--config.log"))),
         "--config.checkpoint.save_interval=1", "--config.log.image_interval=0", "--config.train.num_steps=4")


def _reference(shared_runs):
  """The uninterrupted run: the same flags as 1 process x 8 devices (made once per session)."""
  return shared_runs("demo_1x8_4_steps", lambda folder: launch(folder, *FLAGS, processes=1, devices=8))


@pytest.mark.makes_reference
def test_the_uninterrupted_reference_trains_four_steps(shared_runs):
  assert [r["step"] for r in rows(_reference(shared_runs))] == [1, 2, 3, 4]


class Pod:
  """Two main.py processes of one run, started at once; their outputs in files (a full pipe would block one).
  `environ`, `extra`: each process's own environment variables and flags."""

  def __init__(self, workdir, *flags, environ=({}, {}), extra=((), ()), explicit: bool = True):
    port = free_port()
    self.logs = [tempfile.TemporaryFile("w+") for _ in range(2)]
    self.procs = []
    for i, log in enumerate(self.logs):
      launch_flags = (f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}") \
          if explicit else ()
      cmd = command(workdir, *flags, *extra[i], *launch_flags, f"--distributed_heartbeat_timeout={HEARTBEAT_S}")
      self.procs.append(subprocess.Popen(cmd, env={**env(4), **environ[i]}, cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, text=True))

  def output(self, i: int) -> str:
    self.logs[i].seek(0)
    return self.logs[i].read()

  def wait_for(self, ready, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
      assert time.monotonic() < deadline, f"no {what} within {timeout} s: " + self.tails()
      assert all(p.poll() is None for p in self.procs), f"a process ended before {what}: " + self.tails()
      time.sleep(0.05)

  def finish(self, timeout: float = 600) -> list[int]:
    """Each process's exit status (a process still running after `timeout` fails the test)."""
    deadline = time.monotonic() + timeout
    try:
      for p in self.procs:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      raise AssertionError("still running: " + self.tails()) from None
    finally:
      for p in self.procs:
        p.kill()
    return [p.returncode for p in self.procs]

  def tails(self) -> str:
    return " | ".join(f"process {i}: {self.output(i)[-2500:]}" for i in range(2))


def _steps(workdir) -> list[int]:
  return sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())


def _lines(output: str, start: str) -> list[str]:
  return [line for line in output.splitlines() if line.startswith(start)]


def _clean(output: str) -> None:
  """What a fault must not print: a traceback, XLA's abort or the coordination service's errors."""
  for mark in ("Traceback", "Fatal Python error", "Check failure", "coordination_service", "terminate called"):
    assert mark not in output, output[-3000:]


@pytest.mark.xdist_group("pod")
def test_a_signal_to_one_process_a_damaged_checkpoint_and_a_lost_process_end_and_resume_as_one_run(tmp_path,
                                                                                                   shared_runs):
  run = tmp_path / "run"
  # SIGTERM to process 1 alone once step 2 is logged: both stop after the same step (2 or 3, whichever step it
  # reached them in), save it and exit with 143.
  pod = Pod(run, *FLAGS)
  pod.wait_for(lambda: (run / "metrics.jsonl").exists() and len(rows(run)) >= 2, "step 2")
  pod.procs[1].send_signal(signal.SIGTERM)
  assert pod.finish(timeout=120) == [143, 143], pod.tails()
  stopped = rows(run)[-1]["step"]
  assert stopped in (2, 3) and _steps(run)[-1] == stopped
  for i in range(2):
    assert f"stopping at step {stopped} on SIGTERM (received by process 1)" in pod.output(i), pod.tails()
    _clean(pod.output(i))

  # A truncated file in that checkpoint (its largest params file: one process's shards): both processes resume
  # from the step before; process 0 sets it aside, with one line. Then kill -9 of process 1 once that step is
  # redone: process 0 ends within the heartbeat bound with one line naming process 1 and the last checkpoint.
  truncate_largest_params_file(run / "checkpoints" / str(stopped))
  pod = Pod(run, *FLAGS)
  pod.wait_for(lambda: "moved unreadable checkpoint step" in pod.output(0), "the damaged step set aside")
  pod.wait_for(lambda: len(rows(run)) == stopped and os.path.isdir(run / "checkpoints" / str(stopped)),
               f"step {stopped} redone and saved")
  pod.procs[1].kill()
  killed = time.monotonic()
  assert pod.finish(timeout=HEARTBEAT_S + 60)[0] == 1, pod.tails()
  took = time.monotonic() - killed
  assert took < HEARTBEAT_S + 10, f"{took:.1f} s after the kill"
  out = pod.output(0)
  (moved,) = [line for line in out.splitlines() if "moved unreadable checkpoint step" in line]
  assert f"step {stopped} to {run / 'checkpoints' / 'unreadable' / str(stopped)}" in moved
  assert f"resuming from step {stopped - 1}" in moved
  assert "does not restore: process" in out  # which process could not read it
  last = _steps(run)[-1]
  (lost,) = _lines(out, "error:")
  assert lost == (f"error: process 0: process 1 of the run is lost (sent no heartbeat for {HEARTBEAT_S} s: killed, "
                  f"out of memory, or its host is gone); the last complete checkpoint is step {last} "
                  f"({run / 'checkpoints' / str(last)}): start every process again to resume")
  _clean(out)

  # The restart completes the run: every step's metrics are the uninterrupted run's.
  launch(run, *FLAGS)
  reference = _reference(shared_runs)
  assert_same_metrics(rows(run), rows(reference), KEYS, rtol_first=1e-6, rtol=1e-4)


@pytest.mark.xdist_group("pod")
def test_launch_faults_end_every_process_alike_within_seconds(tmp_path):
  # A workdir another run holds: both processes print process 0's line and exit 2.
  held = tmp_path / "held"
  held.mkdir()
  (held / "lock.json").write_text(json.dumps({"host": socket.gethostname(), "pid": 1, "started": "earlier"}))
  start = time.monotonic()
  pod = Pod(held, "--config=configs/demo.py")
  assert pod.finish(timeout=120) == [2, 2], pod.tails()
  assert time.monotonic() - start < 60
  for i in range(2):
    (line,) = _lines(pod.output(i), "error:")
    assert line.startswith(f"error: process 0: --workdir={held} is in use by another training run (host "), line
    assert "loading" not in pod.output(i)  # before any model
    _clean(pod.output(i))

  # SIGTERM to process 1 of a 2-process --mode=eval (the initial models: no checkpoint needed) while it builds:
  # both end at once with 143 and the line of process 1's signal.
  evaluated = tmp_path / "eval"
  pod = Pod(evaluated, "--config=configs/demo.py", "--mode=eval", "--config.eval.steps=0",
            "--config.eval.benchmark=parti:2", "--config.data.max_prompt_tokens=64")
  pod.wait_for(lambda: "loading ar" in pod.output(1), "the models' build")
  pod.procs[1].send_signal(signal.SIGTERM)
  sent = time.monotonic()
  assert pod.finish(timeout=60) == [143, 143], pod.tails()
  assert time.monotonic() - sent < 15
  assert _lines(pod.output(1), "SIGTERM")[-1] == "SIGTERM received: --mode=eval stopped; exiting"
  assert _lines(pod.output(0), "SIGTERM")[-1] == "SIGTERM received by process 1: --mode=eval stopped; exiting"
  for i in range(2):
    _clean(pod.output(i))

  # A SLURM-style launch (detected from the environment: no launch flags) whose tasks hold other configs: both
  # print the same line naming the difference and exit 2, before any model.
  port = _free_port_for_a_slurm_job()
  slurm = [{"SLURM_JOB_ID": str(port - 61440), "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)} for i in range(2)]
  detected = tmp_path / "slurm"
  pod = Pod(detected, "--config=configs/demo.py", environ=slurm, extra=((), ("--config.seed=1",)), explicit=False)
  assert pod.finish(timeout=120) == [2, 2], pod.tails()
  for i in range(2):
    (line,) = _lines(pod.output(i), "error:")
    assert line == ("error: process 0: process 1 has config.seed=1 and process 0 config.seed=0: start every process "
                    "with the same --config and flags"), line
    assert "loading" not in pod.output(i)
    _clean(pod.output(i))


def _free_port_for_a_slurm_job() -> int:
  """A free port among those JAX derives from a SLURM job id (61440 + id % 4096)."""
  for port in range(61440 + os.getpid() % 4000, 65536):
    with socket.socket() as s:
      try:
        s.bind(("", port))
      except OSError:
        continue
      return port
  raise AssertionError("no free port in 61440..65535")
