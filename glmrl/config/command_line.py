"""The command line's config errors in one line each: a --config file that does not load (its own error at its line,
a key it misspells, no get_config), a --config.<key> the config lacks, a YAML or JSON file routed through its
loader. main.py's flag parser calls these; they import no model code (`python main.py --help` stays light)."""

from __future__ import annotations

import os
import re
import traceback

# What `python main.py` trains without --config (the repository's configs/demo.py).
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs",
                              "demo.py")


def config_value(argv) -> str | None:
  """The --config value of the command line (path[:arg]), or None for the default."""
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def config_path(argv) -> str | None:
  """The --config file named on the command line (without its :arg; a file whose name holds a colon whole), or None
  for the default."""
  value = config_value(argv)
  if value is None or os.path.isfile(value):
    return value
  return value.split(":", 1)[0]


def root_cause(error: BaseException) -> BaseException:
  """The innermost exception of a chain (config_flags wraps a config file's own error twice), as Python prints it:
  `raise ... from None` ends it."""
  seen = {id(error)}
  while True:
    nxt = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    if nxt is None or id(nxt) in seen:
      return error
    seen.add(id(nxt))
    error = nxt


def raised_in_config_file(error: BaseException, argv) -> str | None:
  """'file:line: Type: message' when the config file itself raised (an import it lacks, its own bug, a key it
  misspells), read off the innermost frame of that file in the error's chain; None for the command line's errors."""
  target = os.path.abspath(config_path(argv) or DEFAULT_CONFIG)
  seen, err = set(), error
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename) == target]
    if frames:
      text = str(err).splitlines()[0] if str(err) else ""
      if isinstance(err, (AttributeError, KeyError)):
        _, missing, suggestion = missing_key(err)
        text = f"the config has no key {missing!r}" + (f" (did you mean {suggestion!r}?)" if suggestion else "")
      return f"{frames[-1].filename}:{frames[-1].lineno}: {type(err).__name__}: {text} (raised by the config file)"
    err = err.__cause__ or err.__context__
  return None


def missing_key(error: BaseException) -> tuple[str, str, str | None]:
  """(text, missing key, ml_collections' suggestion or None) of a ConfigDict's AttributeError(KeyError(text))."""
  text = error
  while isinstance(text, BaseException):
    text = text.args[0] if text.args else str(text)
  text = str(text)
  match = re.match(r"'([^']+)'(?:\nDid you mean \"([^\"]+)\")?", text)
  return (text, match.group(1), match.group(2)) if match else (text, text, None)


def unknown_key_message(error: BaseException, argv) -> str:
  """One line for a --config.<key> the config lacks, with ml_collections' "did you mean" when it has one."""
  if isinstance(error, IndexError):
    indexed = [a.split("=")[0] for a in argv if a.startswith("--config.") and "[" in a.split("=")[0]]
    return f"{' '.join(indexed) or ' '.join(argv[1:])}: no such entry in the config's list ({error})"
  text, missing, suggestion = missing_key(error)
  if "config_config" in text:  # what config_flags looks up when the file has no get_config
    return f"{config_path(argv) or DEFAULT_CONFIG}: defines no get_config(arg) function"
  bad = [a for a in argv if a.startswith("--config.") and f".{missing}" in a.split("=")[0]]
  hint = f"did you mean {suggestion!r}?" if suggestion else "all keys: configs/common.py"
  return (f"unknown config key {missing!r} in {' '.join(bad) or ' '.join(argv[1:])}: the config defines no such key "
          f"({hint})")


def not_a_config(argv, config) -> str:
  return (f"--config={config_path(argv) or DEFAULT_CONFIG}: get_config() returned {type(config).__name__}, not an "
          "ml_collections.ConfigDict (start from configs/common.py's get_config() and set its fields)")


def data_file_config(argv, path: str) -> list:
  """argv with `--config=run.yaml` (or .json) read through configs/from_file.py, whose UserError (the file's mistake
  at its line, glmrl.config.files) main.py prints as it is."""
  loader = os.path.join(os.path.dirname(DEFAULT_CONFIG), "from_file.py")
  out, skip = [], False
  for i, a in enumerate(argv):
    if skip:
      skip = False
    elif a.startswith("--config="):
      out.append(f"--config={loader}:{os.path.abspath(path)}")
    elif a == "--config" and i + 1 < len(argv):
      out.append(f"--config={loader}:{os.path.abspath(path)}")
      skip = True
    else:
      out.append(a)
  return out
