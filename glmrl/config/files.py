"""Configs as data: `--config=run.yaml` or `run.json`, a mapping layered on a base recipe (configs/common.py's
defaults, or the file's own `base: configs/demo.py[:arg]`).

For users coming from YAML recipes (TRL, the seeds' repositories) and for a run's own `<workdir>/config.json`. The
mapping is nested (`train: {num_steps: 100}`), dotted (`train.num_steps: 100`) or both; lists stand for tuples.
Each file is read once, faithfully, every value with its line:
- a key given twice (two `train:` blocks, or `train.num_steps` beside `train: {num_steps: ...}`) is refused with
  both lines;
- YAML is read with YAML 1.2's core schema: `1e-5` is a number, `off` and `yes` are strings (a boolean is `true` or
  `false`: YAML 1.1's spellings given to a boolean key are named as such), `null` is checked at its line;
- JSON is read by a JSON parser (tabs, a UTF-8 byte-order mark), with its own positions;
- aliases are bounded (a file that expands to more than MAX_VALUES values is refused in one line).
Each key is checked here against the base's keys and by its rule (glmrl.config.keys), so a mistake is one line
naming the file and line (`run.yaml:3: config.train.num_stepz is not a config key (did you mean ...)`); the rules
between keys run later as for any config. main.py loads the file through `configs/from_file.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import re

import ml_collections

from glmrl.config.choices import REWARD_LISTS
from glmrl.errors import UserError

SUFFIXES = (".yaml", ".yml", ".json")
BASE_KEY = "base"  # the recipe a file is layered on: `base: configs/demo.py` or `configs/demo_decoder.py:dgpo`
MAX_VALUES = 100_000  # more values than any config has many times over: a file that expands beyond is refused
_YAML_11_BOOLEANS = {"yes", "no", "on", "off", "y", "n"}


def is_data_file(path: str | None) -> bool:
  return bool(path) and os.path.splitext(path)[1].lower() in SUFFIXES


@dataclasses.dataclass
class Node:
  """A value of the file with its line: a scalar (`value`), a list (`items`) or a mapping (`pairs`: (key, its
  line, value node))."""
  line: int
  value: object = None
  items: list | None = None
  pairs: list | None = None

  def python(self):
    """The plain value (lists as lists, mappings as dicts)."""
    if self.pairs is not None:
      return {k: v.python() for k, _, v in self.pairs}
    if self.items is not None:
      return [v.python() for v in self.items]
    return self.value


def layered(path: str) -> ml_collections.ConfigDict:
  """The base recipe's config with the file's values set (UserError at the file's line otherwise)."""
  from glmrl.config import keys, rules  # pylint: disable=import-outside-toplevel  (the library's choice lists)

  entries = _entries(path)
  config = _base(path, entries.pop(BASE_KEY, None))
  defaults = keys.leaves(config)
  for key, (node, line) in entries.items():
    where = f"{path}:{line}: config.{key}"
    value = node.python()
    if key in REWARD_LISTS:
      value = tuple(value) if isinstance(value, list) else value
      if not isinstance(value, tuple) or not all(isinstance(v, dict) for v in value):
        raise UserError(f"{where}: must be a list of reward entries ({{name: ..., weight: ...}})")
    elif key not in defaults:
      section = sorted(k for k in defaults if k.startswith(key + "."))
      if section:
        raise UserError(f"{where} is a section of keys ({', '.join(section[:3])}, ...): give it a mapping of them, "
                        f"e.g. {key.rsplit('.', 1)[-1]}: {{{section[0].rsplit('.', 1)[-1]}: ...}}")
      known = list(defaults) + list(REWARD_LISTS)
      close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
      raise UserError(f"{where} is not a config key"
                      + (f" (did you mean config.{close[0]}?)" if close else " (all keys: configs/common.py)"))
    else:
      value = _as_default(where, value, defaults[key])
      rule = keys.RULES.get(key)
      if rule is not None:
        try:
          rule.check(where, value)
        except rules.ConfigError as e:
          raise UserError(str(e)) from None
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  return config


def _base(path: str, entry) -> ml_collections.ConfigDict:
  """The config a file is layered on: `base: FILE.py[:arg]` (relative to the file's folder, else the working
  directory, else this checkout) or configs/common.py's defaults."""
  if entry is None:
    from configs import common  # pylint: disable=import-outside-toplevel

    return common.base_config()
  node, line = entry
  where = f"{path}:{line}: {BASE_KEY}"
  if not isinstance(node.value, str) or not node.value:
    raise UserError(f"{where}: must name a config file, e.g. {BASE_KEY}: configs/demo.py")
  name, _, arg = node.value.partition(":")
  checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  candidates = [os.path.join(os.path.dirname(os.path.abspath(path)), name), os.path.abspath(name),
                os.path.join(checkout, name)]
  found = next((c for c in candidates if os.path.isfile(c)), None)
  if found is None or not found.endswith(".py"):
    raise UserError(f"{where}={node.value!r}: no such config file (a .py recipe such as configs/demo.py, relative to "
                    f"{os.path.dirname(os.path.abspath(path))}, the working directory or {checkout})")
  spec = importlib.util.spec_from_file_location(f"glmrl_base_{abs(hash(found))}", found)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise UserError(f"{where}={node.value!r}: {found} defines no get_config(arg) function")
  try:
    config = module.get_config(arg or None)
  except ValueError as e:
    raise UserError(f"{where}={node.value!r}: {e}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise UserError(f"{where}={node.value!r}: get_config() returned {type(config).__name__}, not a ConfigDict")
  return config


def _as_default(where: str, value, default):
  """A file's value in the type of its default where they differ only as JSON/YAML spell it (lists for tuples,
  whole numbers for floats); null only where the default is null; YAML 1.1's boolean words named for a boolean."""
  if value is None and default is not None:
    raise UserError(f"{where}: null, where the default is {default!r}: give a value, or leave the key out to keep "
                    "the default")
  if isinstance(default, bool) and isinstance(value, str) and value.lower() in _YAML_11_BOOLEANS:
    raise UserError(f"{where}={value!r}: a string (YAML 1.2, which glmrl reads); a boolean is true or false")
  if isinstance(default, tuple) and isinstance(value, list):
    return tuple(value)
  if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  return value


def _entries(path: str) -> dict[str, tuple[Node, int]]:
  """{dotted key: (value node, line)} of the file's leaves (a reward list, REWARD_LISTS, as one leaf); a key given
  twice (in any spelling) is refused with both lines."""
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise UserError(f"--config={path}: {e.strerror or e}") from None
  try:
    text = raw.decode("utf-8-sig")  # a byte-order mark is not part of the text
  except UnicodeDecodeError as e:
    line = raw[:e.start].count(b"\n") + 1
    raise UserError(f"{path}:{line}: byte {raw[e.start]:#04x} is not UTF-8 (save the file as UTF-8)") from None
  root = _json_root(path, text) if path.lower().endswith(".json") else _yaml_root(path, text)
  if root is None:
    return {}
  if root.pairs is None:
    raise UserError(f"{path}:{root.line}: expected a mapping of config keys (e.g. train: {{num_steps: 100}}), got "
                    f"{type(root.python()).__name__}")
  out: dict[str, tuple[Node, int]] = {}
  _flatten(path, root, "", out)
  return out


def _flatten(path: str, node: Node, prefix: str, out: dict) -> None:
  for key, line, child in node.pairs:
    dotted = f"{prefix}{key}"
    if child.pairs is not None and dotted not in REWARD_LISTS:
      _flatten(path, child, f"{dotted}.", out)
      continue
    if dotted in out:
      raise UserError(f"{path}:{line}: config.{dotted} is given twice, at lines {out[dotted][1]} and {line}: keep one")
    out[dotted] = (child, line)


# ------------------------------------------------------------------------------------------------------- YAML
def _yaml_loader():
  """PyYAML's safe loader with YAML 1.2's core schema for booleans and numbers."""
  import yaml  # pylint: disable=import-outside-toplevel  (PyYAML: a dependency of transformers, pinned)

  class Loader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    pass

  replaced = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
  Loader.yaml_implicit_resolvers = {first: [(tag, rx) for tag, rx in resolvers if tag not in replaced]
                                    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
  Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                               list("tTfF"))
  Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                               list("-+0123456789"))
  Loader.add_implicit_resolver(
      "tag:yaml.org,2002:float",
      re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|"
                 r"\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
  return yaml, Loader


def _yaml_root(path: str, text: str) -> Node | None:
  yaml, loader_class = _yaml_loader()
  loader = loader_class(text)
  try:
    node = loader.get_single_node()
    return None if node is None else _from_yaml(path, loader, node, [0])
  except yaml.YAMLError as e:
    mark = getattr(e, "problem_mark", None)
    line = f"{mark.line + 1}:" if mark is not None else ""
    raise UserError(f"{path}:{line} {getattr(e, 'problem', None) or e} (not valid YAML)") from None
  finally:
    loader.dispose()


def _from_yaml(path: str, loader, node, count: list) -> Node:
  import yaml  # pylint: disable=import-outside-toplevel

  count[0] += 1
  line = node.start_mark.line + 1
  if count[0] > MAX_VALUES:
    raise UserError(f"{path}:{line}: the file expands to more than {MAX_VALUES} values (aliases of aliases?): write "
                    "the values out")
  if isinstance(node, yaml.MappingNode):
    seen = {}
    for key_node, _ in node.value:  # the mapping's own keys: each once
      if key_node.tag == "tag:yaml.org,2002:merge":
        continue
      key_line = key_node.start_mark.line + 1
      key = loader.construct_object(key_node)
      if key in seen:
        raise UserError(f"{path}:{key_line}: {key} is given twice, at lines {seen[key]} and {key_line}: keep one")
      seen[key] = key_line
    loader.flatten_mapping(node)  # merge keys (<<: *anchor) first, then the mapping's own: the later one wins
    merged = {}
    for key_node, value_node in node.value:
      key = loader.construct_object(key_node)
      if not isinstance(key, str):
        raise UserError(f"{path}:{key_node.start_mark.line + 1}: key {key!r} is not a name (config keys are words)")
      merged.pop(key, None)
      merged[key] = (key_node.start_mark.line + 1, value_node)
    pairs = [(key, key_line, _from_yaml(path, loader, value_node, count))
             for key, (key_line, value_node) in merged.items()]
    return Node(line, pairs=pairs)
  if isinstance(node, yaml.SequenceNode):
    return Node(line, items=[_from_yaml(path, loader, n, count) for n in node.value])
  return Node(line, value=loader.construct_object(node))


# ------------------------------------------------------------------------------------------------------- JSON
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def _json_root(path: str, text: str) -> Node | None:
  """The JSON document with each value's line (the standard library's decoder for strings and numbers)."""
  if not text.strip():
    return None
  parser = _JsonParser(path, text)
  node = parser.value()
  parser.end()
  return node


class _JsonParser:
  def __init__(self, path: str, text: str):
    self.path, self.text, self.pos = path, text, 0
    self.decoder = json.JSONDecoder()

  def line(self, pos: int | None = None) -> int:
    return self.text.count("\n", 0, self.pos if pos is None else pos) + 1

  def fail(self, what: str):
    raise UserError(f"{self.path}:{self.line()}: {what} (not valid JSON)")

  def skip(self) -> None:
    self.pos = _JSON_SPACE.match(self.text, self.pos).end()

  def end(self) -> None:
    self.skip()
    if self.pos != len(self.text):
      self.fail("Extra data")

  def value(self) -> Node:
    self.skip()
    if self.pos >= len(self.text):
      self.fail("Expecting value")
    line, ch = self.line(), self.text[self.pos]
    if ch == "{":
      return self.mapping(line)
    if ch == "[":
      return self.sequence(line)
    if ch == '"':
      return Node(line, value=self.string())
    for word, value in (("true", True), ("false", False), ("null", None)):
      if self.text.startswith(word, self.pos):
        self.pos += len(word)
        return Node(line, value=value)
    number = _JSON_NUMBER.match(self.text, self.pos)
    if number is None or number.end() == self.pos:
      self.fail("Expecting value")
    self.pos = number.end()
    return Node(line, value=json.loads(number.group()))

  def string(self) -> str:
    try:
      value, self.pos = json.decoder.scanstring(self.text, self.pos + 1)
    except json.JSONDecodeError as e:
      raise UserError(f"{self.path}:{e.lineno}: {e.msg} (not valid JSON)") from None
    return value

  def mapping(self, line: int) -> Node:
    self.pos += 1
    pairs, seen = [], {}
    self.skip()
    if self.text.startswith("}", self.pos):
      self.pos += 1
      return Node(line, pairs=pairs)
    while True:
      self.skip()
      if not self.text.startswith('"', self.pos):
        self.fail("Expecting property name enclosed in double quotes")
      key_line = self.line()
      key = self.string()
      if key in seen:
        raise UserError(f"{self.path}:{key_line}: {key} is given twice, at lines {seen[key]} and {key_line}: keep one")
      seen[key] = key_line
      self.skip()
      if not self.text.startswith(":", self.pos):
        self.fail("Expecting ':' delimiter")
      self.pos += 1
      pairs.append((key, key_line, self.value()))
      self.skip()
      if self.text.startswith(",", self.pos):
        self.pos += 1
        continue
      if self.text.startswith("}", self.pos):
        self.pos += 1
        return Node(line, pairs=pairs)
      self.fail("Expecting ',' delimiter")

  def sequence(self, line: int) -> Node:
    self.pos += 1
    items = []
    self.skip()
    if self.text.startswith("]", self.pos):
      self.pos += 1
      return Node(line, items=items)
    while True:
      items.append(self.value())
      self.skip()
      if self.text.startswith(",", self.pos):
        self.pos += 1
        continue
      if self.text.startswith("]", self.pos):
        self.pos += 1
        return Node(line, items=items)
      self.fail("Expecting ',' delimiter")
