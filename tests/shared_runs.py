"""Runs several tests read, made once per `pytest` session however many pytest-xdist workers ask for them.

`SharedRuns(tmp_path_factory)(name, make)` returns the folder `make(folder)` filled. The first worker to ask makes
it, under a lock on a file in the session's shared temporary folder (pytest-xdist's documented way to make a
session's data once); a worker asking meanwhile waits for it, a later one reads it. A run that failed is not made
again: every test that asks for it fails with its error.

A run that a pod test compares with (one process on 8 devices against 2 processes x 4) is asked for first by a test
of its own, marked `makes_reference` (tests/conftest.py schedules those first): the other worker makes it while
the pod group's worker launches its 2-process runs, and the pod test finds it made.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import traceback

import pytest


class SharedRuns:
  """`(name, make) -> folder`: see the module docstring."""

  def __init__(self, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    # Under pytest-xdist each worker's base is a folder of the session's own (popen-gw0, ...).
    self.root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared_runs"
    self.root.mkdir(parents=True, exist_ok=True)

  def __call__(self, name: str, make) -> pathlib.Path:
    folder, done, failed = self.root / name, self.root / f"{name}.done", self.root / f"{name}.failed"
    with open(self.root / f"{name}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      try:
        if failed.exists():
          pytest.fail(f"the shared run {name!r} failed where another test made it:\n{failed.read_text()}")
        if not done.exists():
          shutil.rmtree(folder, ignore_errors=True)
          folder.mkdir()
          try:
            make(folder)
          except BaseException:
            failed.write_text(traceback.format_exc()[-6000:])
            raise
          done.touch()
      finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
    return folder
