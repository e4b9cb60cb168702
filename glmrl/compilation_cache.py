"""The persistent XLA compilation cache every mode uses by default.

Compiled programs are written to `DEFAULT_DIR` (or JAX's own `JAX_COMPILATION_CACHE_DIR`, or
`--compilation_cache=DIR`; `--compilation_cache=` turns it off) and loaded by the next run that compiles the
same program: a restart, a resume after preemption, `--mode=eval` and `--mode=generate` of the same config.
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


def enable(directory: str) -> str | None:
  """Turns the cache on in `directory` (created if missing); returns it, or None when it is off: `directory` is
  "" or cannot be written (one warning: a run without a cache is slower, never wrong)."""
  if directory:
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
