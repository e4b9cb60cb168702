"""What a finalised checkpoint step folder must hold, read without building a model.

Orbax writes a step under a temporary name and renames it when every item is written, then records the step's
items in `_CHECKPOINT_METADATA`. A run that finds a step at or past its goal reports "already complete" only when
that step reads this far: the record parses, its `meta` item names the same step, and every other item's tree
metadata parses. Whether the arrays themselves restore is known only against the model's abstract state (the
restore at resume); a folder that fails here is left to that restore, which sets it aside or ends the run.
"""

import json
import os

from glmrl.checkpoint.errors import CheckpointError

STEP_RECORD = "_CHECKPOINT_METADATA"
META_ITEM = "meta"  # the JSON item of each step: {"step", "data", ...} (TrainCheckpointer.save)
_ITEM_FILES = {META_ITEM: "metadata"}  # every other item is an array tree with Orbax's `_METADATA`
_TREE_FILE = "_METADATA"


def _read_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def step_problem(directory: str, step: int) -> str | None:
  """Why `<directory>/<step>` is not a complete step (one line), or None when it reads as one."""
  path = os.path.join(directory, str(step))
  try:
    record = _read_json(os.path.join(path, STEP_RECORD))
    items = record.get("item_handlers") if isinstance(record, dict) else None
    if not isinstance(items, dict) or META_ITEM not in items:
      return f"{os.path.join(path, STEP_RECORD)} names no '{META_ITEM}' item"
    for item in items:
      content = _read_json(os.path.join(path, item, _ITEM_FILES.get(item, _TREE_FILE)))
      if item == META_ITEM and (not isinstance(content, dict) or content.get("step") != step):
        return f"{os.path.join(path, item)} records step {content.get('step') if isinstance(content, dict) else content!r}"
  except (OSError, ValueError) as e:  # a missing or unparsable file; json's errors are ValueErrors
    return f"{type(e).__name__}: {e}"
  return None


def newest_is_complete(directory: str, steps: list[int]) -> bool:
  """Whether the newest of `steps` reads as complete; CheckpointError, before any model is built, when none does
  (a folder of garbage named like a step is never a finished run)."""
  problems = {s: step_problem(directory, s) for s in steps}
  if steps and all(problems.values()):
    raise CheckpointError(
        f"no checkpoint step in {directory} is complete: " + "; ".join(f"step {s}: {why}" for s, why in problems.items())
        + " (nothing was changed). Repair or move those step folders, or train in a new --workdir")
  return bool(steps) and problems[steps[-1]] is None


def read_meta(directory: str, step: int) -> dict:
  """The `meta` item of a step that `step_problem` passed: {"step", "data" (the prompt iterator's state), ...}."""
  return _read_json(os.path.join(directory, str(step), META_ITEM, _ITEM_FILES[META_ITEM]))
