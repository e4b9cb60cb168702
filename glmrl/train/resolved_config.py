"""The run's resolved config (defaults, file, flags) in its workdir: `config.json`, and `config.py`, a config file
that gives it back, so `--config=<workdir>/config.py` reruns or extends exactly that run."""

from __future__ import annotations

import json
import os

from glmrl.checkpoint.atomic import write_json_atomic, write_text_atomic

JSON_FILE = "config.json"
PY_FILE = "config.py"

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
  resolved = json.loads(config.to_json_best_effort())
  write_json_atomic(json_path, resolved)
  write_text_atomic(py_path, _PY_TEMPLATE.format(workdir=os.path.abspath(workdir), path=os.path.abspath(py_path),
                                                 text=json.dumps(resolved, sort_keys=True)))
  return json_path
