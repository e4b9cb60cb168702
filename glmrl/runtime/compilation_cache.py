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
import uuid

import jax
from absl import logging

from glmrl.runtime import distributed

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
  devices from 2 processes on 4 each on GPUs (it leaves the device assignment out): a 2 x 4 CPU run whose process 0
  loaded a program a 1 x 8 run had cached waited in that program's collectives for ever."""
  return os.path.join(directory, f"processes_{jax.process_count()}")


def enable(directory: str) -> str | None:
  """Turns the cache on in `directory`'s folder for this process layout (`layout_folder`, created if missing);
  returns that folder, or None when the cache is off: `directory` is "", cannot be written (one warning: a run
  without a cache is slower, never wrong), or several processes run on CPUs (`shared_by_processes`).

  Only process 0 writes entries. With several processes the folder must be one every process sees (a network
  file system on a pod), or the others compile every program at every start while process 0 loads them: each
  process checks that it sees the file process 0 put there, and where one does not (the default folder under
  each host's home, on several hosts) the run says so in one warning."""
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
  if jax.process_count() > 1 and distributed.all_agree("cache folder written", bool(directory)):
    if not seen_by_every_process(directory):
      logging.warning("compilation cache: %s is not one folder every process sees, so the processes other than 0 "
                      "compile every program at every start; pass --compilation_cache=DIR on a file system all "
                      "hosts share", directory)
  jax.config.update("jax_compilation_cache_dir", directory or None)
  return directory or None


def shared_by_processes() -> bool:
  """Whether every process of this run can load the programs the cache holds: not on CPUs across processes.

  On CPUs a program's key and binary belong to the process that compiled it: the keys of two processes compiling
  one program differ in the hash of their CPU topology alone (jax/_src/cache_key.py `_hash_accelerator_config`),
  so process 1 never loads what process 0 wrote; and a program compiled by process 0 does not run in process 1:
  with the key made equal and process 0's binary sent to process 1 (`jax_share_binary_between_hosts`), the
  decoupled recipe's update aborted on a gloo size mismatch ("2560 vs 128") where the two processes' own
  compilations run. A process that loaded the same update (cached by an earlier launch) while its peer compiled
  it aborted the same way."""
  return jax.process_count() == 1 or jax.default_backend() != "cpu"


def seen_by_every_process(directory: str) -> bool:
  """Whether every process sees the file process 0 writes into `directory` (True in a single process)."""
  if jax.process_count() == 1:
    return True
  token = distributed.from_main("cache probe", uuid.uuid4().hex)
  probe = os.path.join(directory, f".shared_probe_{token}")
  if distributed.is_main():
    with open(probe, "w") as f:
      f.write(token)
  distributed.barrier("cache probe written")
  try:
    with open(probe) as f:
      seen = f.read() == token
  except OSError:
    seen = False
  shared = distributed.all_agree("cache probe seen", seen)
  if distributed.is_main():
    os.remove(probe)
  return shared
