"""The persistent XLA compilation cache every mode uses by default.

Compiled programs are written to `DEFAULT_DIR` (or JAX's own `JAX_COMPILATION_CACHE_DIR`, or
`--compilation_cache=DIR`; `--compilation_cache=` turns it off; several processes on CPUs run without it,
`shared_by_processes`) and loaded by the next run that compiles the same program: a restart, a resume after
preemption, `--mode=eval` and `--mode=generate` of the same config.
The first step of the demo is mostly compilation on a CPU; at full size each program takes minutes to compile
on a pod. Programs that compile in under a second are not cached (JAX's
`jax_persistent_cache_min_compile_time_secs`).
"""

from __future__ import annotations

import os
import tempfile

import jax
from absl import logging

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "glmrl", "jax")
ENV = "JAX_COMPILATION_CACHE_DIR"


def folder(flag_value: str | None) -> str:
  """Where the cache goes: the flag's value when it was given ("" = off), else JAX's environment variable, else
  `DEFAULT_DIR`."""
  if flag_value is not None:
    return flag_value
  return os.environ.get(ENV) or DEFAULT_DIR


def layout_folder(directory: str) -> str:
  """The subfolder of `directory` for this run's process count. JAX's cache key does not tell one process on 8
  devices from 2 processes on 4 each: a 2 x 4 CPU run whose process 0 loaded a program a 1 x 8 run had cached waited
  in that program's collectives for ever (the t2i recipe's log-prob metrics; CPUs across processes now run without
  the cache, `shared_by_processes`), and on GPUs the key leaves the device assignment out altogether."""
  return os.path.join(directory, f"processes_{jax.process_count()}")


def shared_by_processes() -> bool:
  """Whether every process of this run can load the programs the cache holds: not on CPUs across processes.

  Only process 0 writes entries, and on CPUs the other processes did not load them: in the second of two identical
  2 x 4 runs JAX's events counted a cache hit in process 0 and none in process 1, which compiled the program again
  (JAX makes the key the same in every process on GPUs only, by leaving out the device assignment:
  jax/_src/cache_key.py). A loaded program and a compiled one need not run their collectives in the same order: a
  2 x 4 launch whose process 0 loaded the decoupled recipe's update (cached by an earlier launch) while process 1
  compiled it aborted in that update on a gloo size mismatch ("2560 vs 128"); the same launch with an empty cache
  ran."""
  return jax.process_count() == 1 or jax.default_backend() != "cpu"


def enable(directory: str) -> str | None:
  """Turns the cache on in `directory`'s folder for this process layout (`layout_folder`, created if missing);
  returns that folder, or None when the cache is off: `directory` is "", cannot be written (one warning: a run
  without a cache is slower, never wrong), or its programs would not load in every process
  (`shared_by_processes`)."""
  if directory and not shared_by_processes():
    logging.info("compilation cache off: on CPUs only process 0 of %d would load its programs",
                 jax.process_count())
    directory = ""
  if directory:
    directory = layout_folder(directory)
    try:
      os.makedirs(directory, exist_ok=True)
      with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_probe_"):
        pass
    except OSError as e:
      logging.warning("compilation cache off: cannot write %s (%s); pass --compilation_cache=DIR to keep compiled "
                      "programs between runs", directory, e.strerror or e)
      directory = ""
  jax.config.update("jax_compilation_cache_dir", directory or None)
  return directory or None
