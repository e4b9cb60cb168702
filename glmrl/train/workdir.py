"""A run folder's layout: what each mode keeps there, checked before any model is built.

A name taken by the wrong kind of entry (a plain file where the run keeps a folder) would otherwise surface as a
traceback once the model is built, or, for `checkpoints`, read as "no steps".
"""

import os

# name -> (is a folder, what the modes keep there)
LAYOUT = {
    "checkpoints": (True, "training checkpoints"),
    "samples": (True, "training sample grids"),
    "eval": (True, "evaluation reports and images"),
    "generate": (True, "generated images"),
    "metrics.jsonl": (False, "per-step metrics"),
    "wandb": (True, "W&B runs (config.log.wandb)"),
}


def layout_problem(workdir: str) -> str | None:
  """One line naming the first entry of `workdir` of the wrong kind, or None."""
  for name, (folder, what) in LAYOUT.items():
    path = os.path.join(workdir, name)
    if os.path.exists(path) and os.path.isdir(path) != folder:
      kind, want = ("folder", "file") if os.path.isdir(path) else ("file", "folder")
      return f"{path} is a {kind}; runs keep their {what} in a {want} of that name: move it away or pick another --workdir"
  return None
