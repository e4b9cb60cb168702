"""Records written whole or not at all: through a temporary file and a rename, by process 0 alone."""

from __future__ import annotations

import json
import os

from glmrl.runtime import distributed


def write_text_atomic(path: str, text: str) -> None:
  """Writes through a temporary file and a rename, so a reader never sees half a file (process 0 of a
  multi-process run writes the run's records; the others hold the same values)."""
  if not distributed.is_main():
    return
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def write_json_atomic(path: str, value) -> None:
  """`value` as indented JSON, by `write_text_atomic`."""
  write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True))
