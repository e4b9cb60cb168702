"""Logs every XLA compilation of every Python process started with this folder on PYTHONPATH: where a test
suite's (or a launch's) CPU time goes, since on XLA:CPU most of it is compiling.

    GLMRL_COMPILE_LOG=/tmp/compiles PYTHONPATH=bench/compile_log python -m pytest -n 2
    python bench/compile_log/summarize.py /tmp/compiles

Each process appends one JSON line per program to GLMRL_COMPILE_LOG/<pid>.jsonl: the seconds
`compile_or_get_cached` took (a load from the persistent cache shows as a short one), the program's name, a digest
of its module text (programs over 0.3 s, to find the same program compiled again), its device count, the process
count, and the pytest test it ran under (pytest's PYTEST_CURRENT_TEST, which subprocesses inherit). It wraps a JAX
internal (jax._src.compiler.compile_or_get_cached) when JAX imports it: a measurement tool, not part of glmrl.
At its exit each process also writes GLMRL_COMPILE_LOG/<pid>.cpu.json: the CPU it used (user + system), its argv,
its test, and whether it is a pytest process (a worker's own tests) or one a test started; a process killed by a
signal or ended by os._exit writes none. Without GLMRL_COMPILE_LOG it does nothing.
"""

import atexit
import hashlib
import importlib.abc
import importlib.util
import json
import os
import resource
import sys
import time

_FOLDER = os.environ.get("GLMRL_COMPILE_LOG")
_MODULE = "jax._src.compiler"
_DIGEST_FROM_S = 0.3  # printing a module's text costs time: only the programs that matter get a digest


def _wrap(compiler) -> None:
  compile_or_get_cached = compiler.compile_or_get_cached
  path = os.path.join(_FOLDER, f"{os.getpid()}.jsonl")

  def logged(backend, computation, devices, *args, **kwargs):
    start = time.perf_counter()
    executable = compile_or_get_cached(backend, computation, devices, *args, **kwargs)
    seconds = time.perf_counter() - start
    import jax

    name = str(computation.operation.attributes["sym_name"]).strip('"')
    digest = hashlib.md5(str(computation).encode()).hexdigest()[:16] if seconds >= _DIGEST_FROM_S else ""
    record = {"s": seconds, "name": name, "digest": digest, "devices": int(devices.size),
              "processes": jax.process_count(), "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
              "argv": " ".join(sys.argv)[:300]}
    with open(path, "a") as f:
      f.write(json.dumps(record) + "\n")
    return executable

  compiler.compile_or_get_cached = logged


class _WrapOnImport(importlib.abc.MetaPathFinder):
  """Wraps the compiler module right after JAX imports it (importing JAX here would slow every process down)."""

  def find_spec(self, name, path, target=None):
    if name != _MODULE:
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    exec_module = spec.loader.exec_module

    def exec_and_wrap(module):
      exec_module(module)
      _wrap(module)

    spec.loader.exec_module = exec_and_wrap
    return spec


def _log_cpu() -> None:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  record = {"cpu": usage.ru_utime + usage.ru_stime, "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
            "argv": " ".join(sys.argv)[:300], "pytest": "pytest" in sys.modules}
  with open(os.path.join(_FOLDER, f"{os.getpid()}.cpu.json"), "w") as f:
    json.dump(record, f)


if _FOLDER:
  os.makedirs(_FOLDER, exist_ok=True)
  sys.meta_path.insert(0, _WrapOnImport())
  atexit.register(_log_cpu)
