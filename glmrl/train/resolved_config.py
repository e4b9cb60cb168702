"""The run's resolved config (defaults, file, flags) in its workdir: `config.json`, and `config.py`, a config file
that gives it back, so `--config=<workdir>/config.py` (or `config.json`) reruns or extends exactly that run, from
any folder: the files and folders it names are stored as absolute paths."""

from __future__ import annotations

import json
import os

from glmrl.checkpoint.atomic import write_json_atomic, write_text_atomic

JSON_FILE = "config.json"
PY_FILE = "config.py"
# The keys naming a file or folder (relative to the working directory the run started in); a reward's `kwargs`
# name theirs with these endings (`ckpt_dir`, `tokenizer_dir`).
PATH_KEYS = ("model.checkpoint_dir", "data.prompts_file", "eval.prompts_file", "eval.drift_lpips_dir")
PATH_ENDINGS = ("_dir", "_file", "_path")

_PY_TEMPLATE = '''"""The resolved config of the training run in {workdir}, as glmrl wrote it when the run started.

    python main.py --config={path} --workdir={workdir} [--config.train.num_steps=...]
"""

import json

import ml_collections

RESOLVED = json.loads({text!r})


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown config argument {{arg!r}}; this config takes none")
  return ml_collections.ConfigDict(RESOLVED)
'''


def write(config, workdir: str) -> str:
  """Writes both files (process 0); returns the path of config.json."""
  json_path, py_path = os.path.join(workdir, JSON_FILE), os.path.join(workdir, PY_FILE)
  resolved = absolute_paths(json.loads(config.to_json_best_effort()))
  write_json_atomic(json_path, resolved)
  write_text_atomic(py_path, _PY_TEMPLATE.format(workdir=os.path.abspath(workdir), path=os.path.abspath(py_path),
                                                 text=json.dumps(resolved, sort_keys=True)))
  return json_path


def absolute_paths(resolved: dict) -> dict:
  """`resolved` (a config as JSON) with every path it holds (PATH_KEYS, the rewards' path arguments) absolute."""
  for key in PATH_KEYS:
    section, _, name = key.rpartition(".")
    holder = resolved.get(section) if section else resolved
    if isinstance(holder, dict) and isinstance(holder.get(name), str) and holder[name]:
      holder[name] = os.path.abspath(holder[name])
  for rewards in (resolved.get("rewards"), (resolved.get("decoder") or {}).get("rewards")):
    for entry in rewards or ():
      kwargs = entry.get("kwargs") if isinstance(entry, dict) else None
      for name, value in (kwargs or {}).items():
        if name.endswith(PATH_ENDINGS) and isinstance(value, str) and value:
          kwargs[name] = os.path.abspath(value)
  return resolved
