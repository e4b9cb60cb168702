"""glmrl: GRPO post-training of GLM-Image.

python main.py --config=configs/<name>.py[:arg] --config.section.key=value --workdir=DIR
  --mode=train|generate|eval|compile

Every config key is listed and commented in configs/common.py. Modes write into --workdir:
  train     checkpoints/<step>/, metrics.jsonl, TensorBoard events, samples/, config.json and config.py (the
            resolved config; --config=<workdir>/config.py reruns it); resumes from the latest step; lock.json
            while it runs (one training run per workdir)
  generate  generate/: one PNG per sample, grid.png, tokens.npz (latest checkpoint, else the initial model); a
            later generate writes generate_2/, generate_3/, ... beside it
  eval      eval/report.json, report.md and index.html (the page of each prompt's samples, eval/images/): the
            rewards of config.eval.benchmark (a shipped set, NAME[:N]) or config.eval.prompts_file at the
            checkpoints of config.eval.steps (e.g. "0,100"; default the latest), with paired bootstrap intervals
            between them; eval/* rewards also in metrics.jsonl and TensorBoard
  compile   compile_report.json/.md: every program of a step compiled for config.compile.topology (e.g.
            v5p-64) from this host, per-chip bytes and whether it fits (needs requirements-compile.txt)
Compiled programs are kept in a persistent cache (--compilation_cache, default $JAX_COMPILATION_CACHE_DIR else
~/.cache/glmrl/jax): a second run, a resume, eval and generate of the same config skip their compilation.
Bad input ends with one line naming the value and exit status 2; a run stopped by SIGTERM or Ctrl-C
saves a checkpoint first and exits 143 or 130. The processes of a multi-process run end as one: a refusal is the
same line in every process, a signal to any of them stops all after the same step, and a lost process ends the
others with one line (exit 1) after --distributed_heartbeat_timeout.
"""

import functools
import importlib
import os
import signal
import sys
import traceback

from absl import app
from absl import flags
import ml_collections
from ml_collections import config_flags

import glmrl  # noqa: F401  (library-wide settings)
from glmrl.config import choices
from glmrl.config import command_line
from glmrl.config import files as config_files
from glmrl.errors import UserError
from glmrl.runtime import distributed
from glmrl.runtime import peers

# Light above (`python main.py --help` and a mistyped flag import no model code, tests/config/test_choices.py); the
# checks, the modes and what they import come once the flags are parsed.

_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and samples.", required=True)
_MODE = flags.DEFINE_enum("mode", "train", choices.MODES, "What to run (see the top of this help).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "Multi-process runs: HOST:PORT of process 0 "
                                   "(detected on SLURM and Cloud TPU pods).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process runs: how many processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process runs: this process's index.")
_DISTRIBUTED_TIMEOUT = flags.DEFINE_integer(
    "distributed_timeout", distributed.START_TIMEOUT_S, "Multi-process runs: seconds the processes wait for each "
    "other to start; then each one still waiting says which are missing and exits 2.", lower_bound=1)
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "distributed_heartbeat_timeout", distributed.HEARTBEAT_TIMEOUT_S, "Multi-process runs: seconds a process may "
    "be silent (killed, out of memory, its host gone) before the others count it lost and exit 1 with one line "
    "naming it and the last complete checkpoint.", lower_bound=1)
_CACHE = flags.DEFINE_string("compilation_cache", None, "Folder of the persistent XLA compilation cache (compiled "
                             "programs reused by the next run, resume, eval or generate); \"\" turns it off. "
                             "Default: $JAX_COMPILATION_CACHE_DIR, else ~/.cache/glmrl/jax.")
_USE_EMA = flags.DEFINE_bool("use_ema", False, "--mode=generate|eval: sample the decoder with the moving average of "
                             "its trained parameters saved with each checkpoint (config.decoder.ema), not the "
                             "parameters themselves.")

# mode -> "module:function(config, workdir)"; imported only when chosen.
_MODES = {
    "train": "glmrl.train.loop:train",
    "generate": "glmrl.train.generate:generate",
    "eval": "glmrl.train.evaluate:evaluate",
    "compile": "glmrl.programs.compile_mode:compile",
}


def _fail(message: str):
  print(f"error: {message}", file=sys.stderr)
  raise SystemExit(2)


def _parse_flags(argv):
  """absl's parser, with every mistake in the command line reported in one line."""
  path = command_line.config_path(argv)
  if path is not None and not os.path.isfile(path):
    _fail(f"--config={path}: no such file" + (" (a folder)" if os.path.isdir(path) else ""))
  if config_files.is_data_file(path):
    if command_line.config_value(argv) != path:
      _fail(f"--config={command_line.config_value(argv)}: a YAML or JSON config takes no :argument (a file names the "
            f"recipe it changes with its own `{config_files.BASE_KEY}:` key)")
    argv = command_line.data_file_config(argv, path)
  try:
    try:
      parsed = flags.FLAGS(argv)
      config = _CONFIG.value  # loads the file: its errors surface here
      if not isinstance(config, ml_collections.ConfigDict):
        _fail(command_line.not_a_config(argv, config))
      return parsed
    except Exception as e:  # pylint: disable=broad-except  # the config file's own error, at its line
      if isinstance(command_line.root_cause(e), UserError):  # a data file's mistake, already at its file and line
        _fail(str(command_line.root_cause(e)))
      raised = command_line.raised_in_config_file(e, argv)
      if raised:
        _fail(raised)
      raise
  except SyntaxError as e:
    _fail(f"{e.filename}:{e.lineno}: {e.msg} (a syntax error in the config file)")
  except (AttributeError, KeyError, IndexError) as e:
    _fail(command_line.unknown_key_message(e, argv))
  except flags.Error as e:
    if "Unexpected None value for flag config" in str(e):
      _fail(command_line.not_a_config(argv, None))
    root = command_line.root_cause(e)
    if root is not e and "Error whilst parsing config file" in str(e):  # the config file's own error
      if isinstance(root, SyntaxError):
        _fail(f"{root.filename}:{root.lineno}: {root.msg} (a syntax error in the config file)")
      if "config_config" in str(root):
        _fail(command_line.unknown_key_message(root, argv))
      _fail(f"--config={path or command_line.DEFAULT_CONFIG}: {root}")
    _fail(str(e).splitlines()[0])
  except SystemExit as e:
    # absl prints --help and exits 1; asking for help is not a failure.
    if any(a in ("--help", "-h", "-?", "--helpshort", "--helpfull") for a in argv[1:]):
      raise SystemExit(0) from None
    raise e


try:  # the default config applies the command line's overrides while it is defined
  _CONFIG = config_flags.DEFINE_config_file(
      "config", command_line.DEFAULT_CONFIG, "Experiment config file, path[:arg]; override keys with "
      "--config.section.key=value (all keys: configs/common.py).", lock_config=True)
except (AttributeError, KeyError, IndexError) as _e:
  _fail(command_line.unknown_key_message(_e, sys.argv))


def _check_workdir(workdir: str) -> None:
  """The workdir must name a folder that is or can be created (before any model is built)."""
  from glmrl.train.workdir import layout_problem, not_a_run_folder  # pylint: disable=import-outside-toplevel

  if not workdir:
    raise UserError("--workdir is empty: pass the folder to write checkpoints, logs and samples into")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UserError(f"--workdir={workdir}: is a file, not a folder")
  parent = os.path.dirname(os.path.abspath(workdir))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent) or not os.access(parent if not os.path.isdir(workdir) else workdir, os.W_OK):
    raise UserError(f"--workdir={workdir}: not writable")
  problem = os.path.isdir(workdir) and (not_a_run_folder(workdir) or layout_problem(workdir))
  if problem:
    raise UserError(problem)


def _launch_checks() -> None:
  """Every check of the inputs this process sees (its workdir, config, files) before any model is built; each
  process makes them, and they refuse together (main)."""
  from glmrl.config import validation  # pylint: disable=import-outside-toplevel
  from glmrl.train import workdir as workdir_lib  # pylint: disable=import-outside-toplevel

  _check_workdir(_WORKDIR.value)
  validation.validate(_CONFIG.value, _MODE.value)
  problem = _MODE.value != "compile" and workdir_lib.other_run_problem(_WORKDIR.value, _CONFIG.value)
  if not problem and _MODE.value == "eval":
    problem = workdir_lib.no_checkpoint_to_evaluate(_WORKDIR.value, _CONFIG.value.eval.steps)
  if problem:
    raise UserError(problem)
  if _USE_EMA.value:
    validation.check_use_ema(_CONFIG.value, _MODE.value)


def _run_facts(config) -> dict:
  """What every process of a run must hold equally (glmrl/runtime/rendezvous.py): its mode, workdir and config."""
  from glmrl.config import keys  # pylint: disable=import-outside-toplevel

  values = {k: repr(v) for k, v in keys.leaves(config).items()}
  for key in choices.REWARD_LISTS:  # which leaves() leaves out
    section, _, name = key.rpartition(".")
    values[key] = repr((config[section] if section else config).get(name))
  return {"mode": _MODE.value, "workdir": os.path.abspath(_WORKDIR.value), "use_ema": _USE_EMA.value,
          "config": values}


def _end_run(line: str, status: int) -> None:
  """Ends this process of a multi-process run on an error only it met: the others are told (glmrl.runtime.peers) and end
  with the same line and status, instead of waiting for it at their next collective."""
  peers.announce_exit({"error": line, "status": status})
  sys.stdout.flush()
  sys.stderr.flush()
  peers.exit_process(status)  # at once: its peer threads may be inside the coordination client


def main(argv):
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}: every setting is a --flag (python main.py --help)")
  from glmrl.checkpoint.manager import resume_point  # pylint: disable=import-outside-toplevel
  from glmrl.checkpoint.signals import StopSignal  # pylint: disable=import-outside-toplevel
  from glmrl.runtime import agreement, compilation_cache, gc_tuning  # pylint: disable=import-outside-toplevel

  module_name, fn_name = _MODES[_MODE.value].split(":")
  gc_tuning.for_tracing()
  try:
    # A signal ends any mode within a second, also inside an XLA compile; train saves its finished steps first.
    with StopSignal(what=f"--mode={_MODE.value} stopped"):
      facts = _run_facts(_CONFIG.value)
      if distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                                _DISTRIBUTED_TIMEOUT.value, facts, _HEARTBEAT_TIMEOUT.value):
        agreement.same_facts(facts)  # a detected launch: compared once jax.distributed runs
      peers.watch(StopSignal.peer_exited, functools.partial(resume_point, _WORKDIR.value), _HEARTBEAT_TIMEOUT.value)
      agreement.checked(_launch_checks)
      compilation_cache.enable(compilation_cache.folder(_CACHE.value))
      kwargs = {"use_ema": True} if _USE_EMA.value else {}
      # Imported here: TensorBoard's imports take seconds that a config failing its checks need not wait for.
      from glmrl.logging import quiet_library_logs  # pylint: disable=import-outside-toplevel
      quiet_library_logs()
      try:
        result = getattr(importlib.import_module(module_name), fn_name)(_CONFIG.value, _WORKDIR.value, **kwargs)
      except UserError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        if not peers.watching():
          raise
        # A collective's error in a multi-process run is most often a peer gone: its line (glmrl.runtime.peers) rather
        # than this traceback, once the coordination service has counted it lost. Else this process's own error,
        # with its traceback, and the others end with it.
        import jax  # pylint: disable=import-outside-toplevel  (imported by glmrl, after its settings)

        if isinstance(e, jax.errors.JaxRuntimeError):
          peers.wait_for_loss(_HEARTBEAT_TIMEOUT.value + 5 * peers.POLL_S)
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        _end_run(f"failed with {type(e).__name__}: {first} (its traceback is in its output)", 1)
      distributed.finished()
  except agreement.Refusal as e:  # every process has it: they leave together
    distributed.leave()
    _fail(str(e))
  except UserError as e:  # this process's alone (mid-run): the others end with it rather than wait for it
    if peers.watching():
      print(f"error: {e}", file=sys.stderr)
      _end_run(str(e), 2)
    _fail(str(e))
  stopped_by = (result or {}).get("stopped_by")
  if stopped_by:  # a scheduler tells a preemption from completion by the status
    raise SystemExit(128 + signal.Signals[stopped_by].value)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
