"""main.py as users launch it: in a new process, or in this one through the same `__main__` block.

A bad input's whole point is the one line main.py prints before any work, and a new Python process per case
(imports, JAX start-up: about 15 s on a loaded core) is most of what such a case costs. `main_in_process` runs
main.py's `__main__` block here (`runpy`, as `python main.py` runs it) with its own argv, working directory and
absl flags, and returns what a subprocess would: the exit status, stdout and stderr (captured at the file
descriptors, so XLA's and absl's lines are in them), and the number of XLA programs compiled meanwhile, which an
error "before any work" leaves at 0. A few cases still launch `python main.py` (tests/test_main.py) to prove that
the process itself ends the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import runpy
import subprocess
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(ROOT, "main.py")
# A hang detector for a main.py run of a few tiny steps, not a speed check: a loaded 2-core machine has taken
# several minutes for what an idle one does in one.
TIMEOUT_S = 1200


def without_torch(module: str, *args) -> list[str]:
  """The command line of `python -m module args` in a process where torch cannot be imported, as where it is not
  installed (`sys.modules["torch"] = None`: imports fail, transformers' probe finds none)."""
  return [sys.executable, "-c", "import runpy, sys; sys.modules['torch'] = None; "
          "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)", module, *args]


@dataclasses.dataclass
class Result:
  returncode: int
  stdout: str
  stderr: str
  compiles: int | None = None  # XLA programs compiled by an in-process run (None: a subprocess)


def run_main(*args, tmp_path, timeout: int = TIMEOUT_S) -> Result:
  """`python main.py --workdir=tmp_path *args` in a new process, from the repository root."""
  done = subprocess.run([sys.executable, MAIN, f"--workdir={tmp_path}", *args], capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT)
  return Result(done.returncode, done.stdout, done.stderr)


def main_in_process(*args, tmp_path) -> Result:
  """main.py's `__main__` block in this process with argv `main.py --workdir=tmp_path *args`: what `run_main`
  returns, plus the number of XLA compilations it caused."""
  from absl import app
  from absl import flags

  app.define_help_flags()  # absl's own (--help, ...), defined by a process's first app.run: not main.py's
  before = set(flags.FLAGS)
  # A new process's first app.run sets absl up (its log handler; INFO verbosity unless --verbosity says otherwise):
  # so does every run here.
  app._run_init.done = False  # pylint: disable=protected-access
  app._register_and_parse_flags_with_usage.done = False  # pylint: disable=protected-access
  argv, cwd = sys.argv, os.getcwd()
  sys.modules.pop("config_config", None)
  code = 0
  with _count_compiles() as compiles, captured_output() as output:
    try:
      sys.argv = [MAIN, f"--workdir={tmp_path}", *args]
      os.chdir(ROOT)
      runpy.run_path(MAIN, run_name="__main__")
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # pylint: disable=broad-except  # as the interpreter ends a process: traceback, status 1
      traceback.print_exc()
      code = 1
    finally:
      sys.argv = argv
      os.chdir(cwd)
      _forget_flags(flags.FLAGS, before)
      # ml_collections loads --config's file as the module `config_config` with importlib's load_module, which
      # runs it in the namespace of the module of that name if there is one: a new process has none.
      sys.modules.pop("config_config", None)
  return Result(code, output["stdout"], output["stderr"], compiles[0])


def completed(*args, tmp_path, in_process: bool = True) -> Result:
  """main.py run to its end, in this process (`main_in_process`) or in a new one (`run_main`): asserts exit
  status 0, showing stderr's tail otherwise."""
  result = (main_in_process if in_process else run_main)(*args, tmp_path=tmp_path)
  assert result.returncode == 0, (result.stderr + result.stdout)[-4000:]
  return result


def _forget_flags(flag_values, before: set) -> None:
  """Drops the flags main.py and its config defined (the next run defines them anew) and unparses the rest."""
  for name in set(flag_values) - before:
    if name in flag_values:  # a short name goes with its long one
      delattr(flag_values, name)
  flag_values.unparse_flags()


@contextlib.contextmanager
def _count_compiles():
  """[n]: the XLA compilations (backend compiles, also of a cache hit's lookup) while inside."""
  from jax import monitoring

  count = [0]

  def listener(event: str, duration: float, **kwargs):
    del duration, kwargs
    if event == "/jax/core/compile/backend_compile_duration":
      count[0] += 1

  monitoring.register_event_duration_secs_listener(listener)
  try:
    yield count
  finally:
    monitoring.unregister_event_duration_listener(listener)


@contextlib.contextmanager
def captured_output():
  """{'stdout', 'stderr'} filled on exit with what this process wrote meanwhile: file descriptors 1 and 2
  (C++ libraries), Python's sys.stdout/sys.stderr and absl's log handler (whose stream was bound at import)."""
  from absl import logging as absl_logging

  handler = absl_logging.get_absl_handler().python_handler
  saved = {"sys": (sys.stdout, sys.stderr), "stream": handler.stream}
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  files = [tempfile.TemporaryFile("w+b"), tempfile.TemporaryFile("w+b")]
  saved_fds = [os.dup(1), os.dup(2)]
  output = {}
  try:
    os.dup2(files[0].fileno(), 1)
    os.dup2(files[1].fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
    handler.stream = sys.stderr
    yield output
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout, sys.stderr = saved["sys"]
    handler.stream = saved["stream"]
    os.dup2(saved_fds[0], 1)
    os.dup2(saved_fds[1], 2)
    for fd in saved_fds:
      os.close(fd)
    for name, f in zip(("stdout", "stderr"), files):
      f.seek(0)
      output[name] = f.read().decode("utf-8", errors="replace")
      f.close()


def assert_one_line_error(result: Result, message: str, before_any_work: bool = True) -> None:
  """Exit status 2 and the message on stderr's single 'error:' line, no traceback; `before_any_work`: for an
  in-process run, no XLA program was compiled (a subprocess run's callers check what it wrote)."""
  output = result.stderr + result.stdout
  assert result.returncode == 2, output[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and message in errors[0], output[-3000:]
  assert "Traceback" not in output, output[-3000:]
  if before_any_work and result.compiles is not None:
    assert result.compiles == 0, f"{result.compiles} XLA programs compiled before the error"
