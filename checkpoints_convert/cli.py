"""What every converter's command line shares: a user error is one line on stderr and exit code 1."""

from __future__ import annotations

import sys
from typing import Callable


def run(convert: Callable[[], object]) -> int:
  """Calls `convert()` and returns 0, printing its result when that is a summary line (a str; the
  pipeline converters log their own lines); or prints the ValueError / FileNotFoundError that
  names the bad input and returns 1."""
  try:
    summary = convert()
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if isinstance(summary, str):
    print(summary)
  return 0
