"""Background threads of libraries (Orbax's checkpoint writes) that fail with an OSError (a full disk) print a
traceback through `threading.excepthook`; here it becomes one warning line. The run reports what matters itself:
a failed checkpoint save stops it with one `error:` line."""

from __future__ import annotations

import threading
import traceback

from absl import logging

_QUIETED: dict[str, str] = {}  # a package's name in its files' paths -> the warning, with %s for the error


def os_error_raised_in(error: BaseException | None, package: str) -> bool:
  """Whether `error`, or one it was raised while handling (or from), is an OSError raised in `package`'s code
  (a frame of its traceback in a file whose path names the package)."""
  while error is not None:
    if isinstance(error, OSError) and any(package in f.filename for f in traceback.extract_tb(error.__traceback__)):
      return True
    error = error.__cause__ or error.__context__
  return False


def _hook(previous):
  def hook(args):
    for package, message in _QUIETED.items():
      if os_error_raised_in(args.exc_value, package):
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
