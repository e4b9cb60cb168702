"""One training run per workdir (glmrl.checkpoint.lock)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from glmrl.checkpoint.lock import LOCK_FILE, WorkdirLock
from glmrl.errors import UserError


def _holder(tmp_path, **fields):
  (tmp_path / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "started": "then", **fields}))


def test_held_for_the_run_and_released_after(tmp_path):
  with WorkdirLock(str(tmp_path)):
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
  assert not (tmp_path / LOCK_FILE).exists()
  with WorkdirLock(str(tmp_path)):
    pass


def test_a_live_holder_is_named_and_a_dead_one_is_taken_over(tmp_path, caplog):
  live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    _holder(tmp_path, pid=live.pid)
    with pytest.raises(UserError, match=rf"in use by another training run \(host .*, pid {live.pid}, since then"):
      WorkdirLock(str(tmp_path)).__enter__()
  finally:
    live.kill()
    live.wait()
  # The same pid, now dead: a stale lock, taken over with a warning.
  with WorkdirLock(str(tmp_path)):
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] != live.pid
  assert any("taking over" in r.getMessage() for r in caplog.records)


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
  (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "elsewhere-0", "pid": 1, "started": "then"}))
  with pytest.raises(UserError, match="host elsewhere-0, pid 1.*if that run is gone, delete the file"):
    WorkdirLock(str(tmp_path)).__enter__()
  assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "elsewhere-0"
