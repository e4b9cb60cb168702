"""Background threads of libraries (Orbax's checkpoint writes) that fail with an OSError (a full disk) print a
traceback through `threading.excepthook`; here it becomes one warning line. The run reports what matters itself:
a failed checkpoint save stops it with one `error:` line."""

from __future__ import annotations

import threading
import traceback

from absl import logging

_QUIETED: dict[str, str] = {}  # a package's name in its files' paths -> the warning, with %s for the error


def _hook(previous):
  def hook(args):
    frames = traceback.extract_tb(args.exc_traceback) if args.exc_traceback else []
    if issubclass(args.exc_type, OSError):
      for package, message in _QUIETED.items():
        if any(package in f.filename for f in frames):
          logging.warning(message, args.exc_value)
          return
    previous(args)

  hook.glmrl_quieted = True
  return hook


def quiet_os_errors(package: str, message: str) -> None:
  """OSErrors raised in `package`'s threads are logged as `message % error` instead of a traceback."""
  _QUIETED[package] = message
  if not getattr(threading.excepthook, "glmrl_quieted", False):
    threading.excepthook = _hook(threading.excepthook)
