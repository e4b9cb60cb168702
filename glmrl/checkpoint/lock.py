"""One training run per workdir: `<workdir>/lock.json` names the run that holds it (host, pid, start).

Two trainings into one folder would interleave their metrics rows and overwrite each other's checkpoints.
The lock is taken before any model is built and removed when the run ends, however it ends short of
being killed; a lock left by a killed process on this host is taken over with a warning. A lock held from
another host cannot be checked from here: the message names it and the file to delete if it is stale.
In a multi-process run, process 0 holds it for all, and a refusal is every process's (`agreement.refuse_together`).
"""

from __future__ import annotations

import json
import os
import socket
import time

from absl import logging

from glmrl.runtime import agreement
from glmrl.runtime import distributed
from glmrl.errors import UserError

LOCK_FILE = "lock.json"


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


class WorkdirLock:
  """Context manager holding `<workdir>/lock.json` exclusively (see the module docstring)."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_FILE)
    self.held = False

  def _read(self) -> dict | None:
    try:
      with open(self.path) as f:
        holder = json.load(f)
      return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
      return None

  def _try_create(self, me: dict) -> bool:
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)
    return True

  def __enter__(self) -> "WorkdirLock":
    problem = None
    if distributed.is_main():
      try:
        self._take()
      except UserError as e:
        problem = str(e)
    agreement.refuse_together(problem)
    return self

  def _take(self) -> None:
    os.makedirs(self.workdir, exist_ok=True)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for attempt in range(3):
      if self._try_create(me):
        self.held = True
        return
      holder = self._read()
      if holder is None and attempt == 0:  # being written by a run that just took it
        time.sleep(0.2)
        continue
      if holder is None or (holder.get("host") == me["host"] and (
          holder.get("pid") == me["pid"] or not _alive(int(holder.get("pid", -1))))):
        logging.warning("taking over %s, left by a run that is gone (%s)", self.path, holder)
        try:
          os.remove(self.path)
        except FileNotFoundError:
          pass
        continue
      raise UserError(f"--workdir={self.workdir} is in use by another training run (host {holder.get('host')}, "
                      f"pid {holder.get('pid')}, since {holder.get('started')}; {self.path}): wait for it to end "
                      "or use another --workdir (if that run is gone, delete the file)")
    raise UserError(f"--workdir={self.workdir}: could not take {self.path} (another run keeps taking it)")

  def __exit__(self, *exc) -> None:
    self.release()

  def release(self) -> None:
    """Removes the lock file if this process holds it (also from a signal's immediate exit)."""
    if self.held:
      holder = self._read()
      if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        os.remove(self.path)
      self.held = False
