"""Configs as data: `--config=run.yaml` or `run.json`, a mapping layered on configs/common.py's defaults.

For users coming from YAML recipes (TRL, the seeds' repositories) and for a run's own `<workdir>/config.json`. The
mapping is nested (`train: {num_steps: 100}`), dotted (`train.num_steps: 100`) or both; lists stand for tuples.
Each key is checked here against the defaults and by its config_checks rule, so a mistake is one line naming the
file and line (`run.yaml:3: config.train.num_stepz is not a config key (did you mean ...)`); the rules between
keys run later as for any config. main.py loads the file through `configs/from_file.py`.
"""

from __future__ import annotations

import difflib
import json
import os

import ml_collections

from glmrl.errors import UserError

SUFFIXES = (".yaml", ".yml", ".json")
# Lists of dicts that replace a default whole (their entries are not config keys).
WHOLE = ("rewards", "decoder.rewards")


def is_data_file(path: str | None) -> bool:
  return bool(path) and os.path.splitext(path)[1].lower() in SUFFIXES


def layered(path: str) -> ml_collections.ConfigDict:
  """configs/common.py's `base_config()` with the file's values set (UserError at the file's line otherwise)."""
  from configs import common  # pylint: disable=import-outside-toplevel
  from glmrl import config_checks  # pylint: disable=import-outside-toplevel

  config = common.base_config()
  defaults = config_checks.leaves(config)
  for key, (value, line) in _entries(path).items():
    where = f"{path}:{line}: config.{key}"
    if key in WHOLE:
      value = tuple(value) if isinstance(value, list) else value
      if not isinstance(value, tuple) or not all(isinstance(v, dict) for v in value):
        raise UserError(f"{where}: must be a list of reward entries ({{name: ..., weight: ...}})")
    elif key not in defaults:
      known = list(defaults) + list(WHOLE)
      close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
      raise UserError(f"{where} is not a config key"
                      + (f" (did you mean config.{close[0]}?)" if close else " (all keys: configs/common.py)"))
    else:
      value = _as_default(value, defaults[key])
      rule = config_checks.RULES.get(key)
      if rule is not None and value is not None:
        try:
          rule.check(where, value)
        except config_checks.ConfigError as e:
          raise UserError(str(e)) from None
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  return config


def _as_default(value, default):
  """A file's value in the type of its default where they differ only as JSON/YAML spell it (lists for tuples,
  whole numbers for floats)."""
  if isinstance(default, tuple) and isinstance(value, list):
    return tuple(value)
  if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  return value


def _entries(path: str) -> dict[str, tuple[object, int]]:
  """{dotted key: (value, line)} of the file's leaves (a WHOLE key's list as one leaf)."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError as e:
    raise UserError(f"--config={path}: {e.strerror or e}") from None
  import yaml  # pylint: disable=import-outside-toplevel  (PyYAML: a dependency of transformers, pinned)

  try:
    if path.lower().endswith(".json"):
      data = json.loads(text)
    else:
      data = yaml.safe_load(text)
    node = yaml.compose(text, Loader=yaml.SafeLoader)  # JSON is YAML: the same walk gives its lines
  except json.JSONDecodeError as e:
    raise UserError(f"{path}:{e.lineno}: {e.msg} (not valid JSON)") from None
  except yaml.YAMLError as e:
    mark = getattr(e, "problem_mark", None)
    line = f"{mark.line + 1}:" if mark is not None else ""
    raise UserError(f"{path}:{line} {getattr(e, 'problem', None) or e} (not valid YAML)") from None
  if data is None:
    return {}
  if not isinstance(data, dict):
    raise UserError(f"{path}:1: expected a mapping of config keys (e.g. train: {{num_steps: 100}}), got "
                    f"{type(data).__name__}")
  out: dict[str, tuple[object, int]] = {}
  _walk(data, node, "", out)
  return out


def _walk(data: dict, node, prefix: str, out: dict) -> None:
  lines = {}
  if node is not None and hasattr(node, "value") and isinstance(node.value, list):
    for key_node, value_node in node.value:
      if hasattr(key_node, "value"):
        lines[str(key_node.value)] = (key_node.start_mark.line + 1, value_node)
  for key, value in data.items():
    line, child = lines.get(str(key), (1, None))
    dotted = f"{prefix}{key}"
    if isinstance(value, dict) and dotted not in WHOLE:
      _walk(value, child, f"{dotted}.", out)
    else:
      out[dotted] = (value, line)
