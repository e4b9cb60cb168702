"""Lines a library prints on the process's stderr (file descriptor 2, from C++ too) that a user has no use for, left
out: inside `without(pattern)` fd 2 goes to a temporary file, and what was written goes back on exit without the
lines matching `pattern`. Standard library only: glmrl/__init__.py uses it before jax is imported.

`console_fd()` is where a line must go that has to be seen even if the process ends inside such a context (an
immediate exit on a signal, glmrl.checkpoint.signals): the real stderr."""

import contextlib
import os
import re
import sys
import tempfile

_saved_fds = []  # the real stderr of each context in force, innermost last


def console_fd() -> int:
  """The file descriptor of the process's real stderr, also inside `without`."""
  return _saved_fds[0] if _saved_fds else 2


@contextlib.contextmanager
def without(pattern: str):
  """fd 2 without the lines that match `pattern` (a regular expression of one whole line) inside this context."""
  noise = re.compile(pattern)
  sys.stderr.flush()
  saved, captured = os.dup(2), tempfile.TemporaryFile()
  os.dup2(captured.fileno(), 2)
  _saved_fds.append(saved)
  try:
    yield
  finally:
    sys.stderr.flush()
    _saved_fds.pop()
    os.dup2(saved, 2)
    os.close(saved)
    with captured:
      captured.seek(0)
      lines = captured.read().decode("utf-8", errors="replace").splitlines(keepends=True)
    kept = "".join(line for line in lines if not noise.match(line.rstrip("\n")))
    if kept:
      os.write(2, kept.encode("utf-8"))
