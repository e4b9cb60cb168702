"""The committed generated pages' one rule: a generator script writes its page, or with `--check` says in one line
that the committed page is stale (exit 1); docs/gen_config_reference.py and docs/gen_released_recipes.py use it."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_or_check(out: str, page: str, argv, script: str) -> int:
  """Writes `page` to `out`, or with `--check` in `argv` compares it with the committed file (`script`: the
  generator's path, for the message)."""
  relpath = os.path.relpath(out, ROOT)
  if "--check" in argv:
    with open(out, encoding="utf-8") as f:
      if f.read() != page:
        print(f"error: {relpath} is stale: run python {script}", file=sys.stderr)
        return 1
    return 0
  with open(out, "w", encoding="utf-8") as f:
    f.write(page)
  print(f"wrote {relpath}")
  return 0
