"""glmrl: GRPO post-training of GLM-Image.

python main.py --config=configs/<name>.py[:arg] --config.section.key=value --workdir=DIR
  --mode=train|generate|eval|compile

Every config key is listed and commented in configs/common.py. Modes write into --workdir:
  train     checkpoints/<step>/, metrics.jsonl, TensorBoard events, samples/ (resumes from the latest step)
  generate  generate/: one PNG per sample, grid.png, tokens.npz (latest checkpoint, else the initial model)
  eval      eval/ rewards in metrics.jsonl and samples/ for config.eval.prompts_file (latest checkpoint)
  compile   compile_report.json/.md: every program of a step compiled for config.compile.topology (e.g.
            v5p-64) from this host, per-chip bytes and whether it fits (needs requirements-compile.txt)
Bad input ends with one line naming the value and exit status 2; a run stopped by SIGTERM or Ctrl-C
saves a checkpoint first and exits 143 or 130.
"""

import importlib
import os
import signal
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

import glmrl  # noqa: F401  (library-wide settings)
from glmrl import config_checks
from glmrl import distributed
from glmrl.errors import UserError

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "demo.py")
_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "Experiment config file, path[:arg]; override keys with --config.section.key=value "
    "(all keys: configs/common.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and samples.", required=True)
_MODE = flags.DEFINE_enum("mode", "train", config_checks.MODES, "What to run (see the top of this help).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "Multi-process runs: HOST:PORT of process 0 "
                                   "(detected on SLURM and Cloud TPU pods).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process runs: how many processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process runs: this process's index.")

# mode -> "module:function(config, workdir)"; imported only when chosen.
_MODES = {
    "train": "glmrl.train.loop:train",
    "generate": "glmrl.train.generate:generate",
    "eval": "glmrl.train.evaluate:evaluate",
    "compile": "glmrl.aot.mode:compile",
}


def _parse_flags(argv):
  """absl's parser, with unknown config keys reported by their full override."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    missing = str(e).split("'")[1] if "'" in str(e) else str(e)
    bad = [a for a in argv if a.startswith("--config.") and f".{missing}" in a.split("=")[0]]
    _fail(f"unknown config key {missing!r} in {' '.join(bad) or argv}: the config file defines no such key "
          "(all keys: configs/common.py)")
  except flags.Error as e:
    _fail(str(e))
  except SystemExit as e:
    # absl prints --help and exits 1; asking for help is not a failure.
    if any(a in ("--help", "-h", "-?", "--helpshort", "--helpfull") for a in argv[1:]):
      raise SystemExit(0) from None
    raise e


def _fail(message: str):
  print(f"error: {message}", file=sys.stderr)
  raise SystemExit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  module_name, fn_name = _MODES[_MODE.value].split(":")
  try:
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    config_checks.validate(_CONFIG.value, _MODE.value)
    result = getattr(importlib.import_module(module_name), fn_name)(_CONFIG.value, _WORKDIR.value)
  except UserError as e:
    _fail(str(e))
  stopped_by = (result or {}).get("stopped_by")
  if stopped_by:  # a scheduler tells a preemption from completion by the status
    raise SystemExit(128 + signal.Signals[stopped_by].value)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
