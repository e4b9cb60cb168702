"""Errors in what the user gave (config, flags, prompt files, checkpoint folders).

`main.py` prints a `UserError` as one line and exits with status 2; any other exception is a
bug and keeps its traceback. The other command-line tools follow the same rule (`run_command`).
"""

import argparse
import sys
from typing import Callable


class UserError(ValueError):
  """Bad input from the user; the message names the value and where it came from."""


def run_command(work: Callable[[], object]) -> int:
  """What every `python -m` entry point shares with main.py: bad input (a UserError, or an OSError naming the file)
  is one `error:` line on stderr and exit status 2; any other exception is a bug and keeps its traceback (a
  ValueError from numpy or jax inside a converter reads like bad input without it). Returns 0 after `work()`,
  printing its result when that is a summary line (a str)."""
  try:
    summary = work()
  except (UserError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if isinstance(summary, str):
    print(summary)
  return 0


class ArgumentParser(argparse.ArgumentParser):
  """argparse's parser whose usage errors end as every other bad input does: one `error:` line (with where the
  help is) and exit status 2, not the usage block."""

  def error(self, message):
    print(f"error: {message} ({self.prog} --help)", file=sys.stderr)
    raise SystemExit(2)
