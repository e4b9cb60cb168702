"""glmrl entry point.

python main.py --config=configs/<name>.py[:arg] --config.section.key=value --workdir=DIR --mode=train|generate|eval
"""

import importlib
import os

from absl import app
from absl import flags
from ml_collections import config_flags

import glmrl  # noqa: F401  (library-wide settings)
from glmrl import config_checks

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "demo.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Experiment config file, path[:arg].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and samples.", required=True)
_MODE = flags.DEFINE_enum("mode", "train", ["train", "generate", "eval"], "What to run.")

# mode -> "module:function(config, workdir)"; imported only when chosen.
_MODES = {
    "train": "glmrl.train.loop:train",
    "generate": "glmrl.sampling.generate:generate",
    "eval": "glmrl.train.evaluate:evaluate",
}


def _parse_flags(argv):
  """absl's parser, with unknown config keys reported by their full override."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    missing = str(e).split("'")[1] if "'" in str(e) else str(e)
    bad = [a for a in argv if a.startswith("--config.") and f".{missing}" in a.split("=")[0]]
    raise SystemExit(f"unknown config key {missing!r} in {' '.join(bad) or argv}: "
                     "the config file defines no such key") from None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  config_checks.validate(config)
  module_name, fn_name = _MODES[_MODE.value].split(":")
  getattr(importlib.import_module(module_name), fn_name)(config, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
