"""Compute threads of a benchmark's two sides, set before JAX starts its CPU client.

XLA:CPU has no flag for its intra-op thread count: its pools are sized by the CPUs the process may run on. So
`limit(n)` pins the process (and its children) to n CPUs, turns off Eigen's own threading, and gives torch n
threads; both sides then compute on the same n cores.
"""

from __future__ import annotations

import os


def limit(n: int) -> str:
  """Pins this process to its first n allowed CPUs (0: leaves the library defaults); the setting in words."""
  if not n:
    return f"library defaults (XLA:CPU its own pool on {len(os.sched_getaffinity(0))} cores; torch {_torch_threads()})"
  cpus, os.environ["XLA_FLAGS"] = _cpus(n), _xla_flags(os.environ)
  os.sched_setaffinity(0, cpus)
  _torch_threads(n)
  return f"{n} on each side (the process pinned to CPU {','.join(map(str, cpus))}; Eigen single-threaded; torch {n})"


def for_child(n: int, env: dict) -> tuple[dict, object]:
  """(environment, preexec_fn) that give a child process n compute threads as `limit` does (0: unchanged)."""
  if not n:
    return env, None
  cpus = _cpus(n)
  return {**env, "XLA_FLAGS": _xla_flags(env)}, lambda: os.sched_setaffinity(0, cpus)


def _cpus(n: int) -> list[int]:
  return sorted(os.sched_getaffinity(0))[:n]


def _xla_flags(env) -> str:
  # XLA reads XLA_FLAGS once, when its backend starts; a token without dashes ends its parsing.
  return ("--xla_cpu_multi_thread_eigen=false " + env.get("XLA_FLAGS", "")).strip()


def _torch_threads(n: int | None = None) -> int | str:
  try:
    import torch
  except ImportError:
    return "not installed"
  if n:
    torch.set_num_threads(n)
  return torch.get_num_threads()
