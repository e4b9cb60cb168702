"""What the processes of one run decide together: a refusal, equal facts, the step to stop at, the step restored.

Each decision is one exchange through JAX's coordination service (the key-value store `jax.distributed` starts, no
device collective), made by every process at the same point of the run, and it ends alike in all of them: a refusal
is the same `UserError` line in every process (main.py prints it, exit status 2), naming the process that refused.
In a single process each decision is that process's own.
"""

from __future__ import annotations

import json
from typing import Callable

import jax

from glmrl.errors import UserError
from glmrl.runtime import distributed
from glmrl.runtime import rendezvous


class Refusal(UserError):
  """A refusal every process of the run made together (`refuse_together`): each leaves the coordination service
  in order (main.py) and ends with this line."""


def refuse_together(problem: str | None) -> None:
  """A UserError in every process when any process has a `problem` (one line; None: no problem): the first such
  process's, prefixed with its index when several processes run."""
  if jax.process_count() == 1:
    if problem:
      raise UserError(problem)
    return
  problems = distributed.every_process("refusal", problem or "")
  refused = [(i, p) for i, p in enumerate(problems) if p]
  if refused:
    i, first = refused[0]
    others = f" (and {len(refused) - 1} more process(es))" if len(refused) > 1 else ""
    raise Refusal(f"process {i}{others}: {first}")


def checked(check: Callable[[], object]):
  """`check()`'s result where it passes in every process; else `refuse_together` of its UserError: every process
  refuses with the same line, none goes on to build a model while another has stopped. `check` must not exchange
  anything with the other processes itself (a process that refused would not be there to answer). Another
  exception (a bug) keeps its traceback in its process and is one line in the others."""
  try:
    result, problem, crash = check(), None, None
  except UserError as e:
    result, problem, crash = None, str(e), None
  except Exception as e:  # pylint: disable=broad-except  # told to the others, then raised here as it is
    result, crash = None, e
    first = (str(e).strip().splitlines() or [""])[0][:300]
    problem = f"failed with {type(e).__name__}: {first} (its traceback is in its output)"
  if crash is not None and jax.process_count() == 1:
    raise crash
  try:
    refuse_together(problem)
  except UserError:
    if crash is not None:
      raise crash from None
    raise
  return result


def same_facts(facts: dict) -> None:
  """`refuse_together` when any process holds other `facts` (rendezvous.FACTS' keys) than process 0: for launches
  whose processes did not meet in `rendezvous.meet` (SLURM, Cloud TPU), compared once `jax.distributed` runs."""
  if jax.process_count() == 1:
    return
  held = [json.loads(v) for v in distributed.every_process("facts", json.dumps(facts, sort_keys=True))]
  mine = {"num_processes": jax.process_count(), **held[0]}
  problem = next((p for i, theirs in enumerate(held[1:], 1)
                  if (p := rendezvous.mismatch({"process_id": i, "num_processes": jax.process_count(), **theirs},
                                               mine))), None)
  refuse_together(problem if jax.process_index() == 0 else None)


def stop_signal(received: str | None) -> tuple[str, int] | None:
  """(signal name, process) of the first process, in process order, that received a stop signal by now, the same
  in every process; None when none did. Called once per step by every process, after the step: all of them stop
  after the same step (a signal that arrives after a process's call counts at the next step)."""
  if jax.process_count() == 1:
    return (received, 0) if received else None
  names = distributed.every_process("stop", received or "", forget_previous=True)
  return next(((name, i) for i, name in enumerate(names) if name), None)


def steps_to_try(steps: list[int]) -> list[int]:
  """Process 0's list of checkpoint steps, in every process: every process tries the same steps in the same order
  (a shared folder may list a step on one host a moment before another)."""
  if jax.process_count() == 1:
    return list(steps)
  return json.loads(distributed.from_main("checkpoint steps", json.dumps(sorted(steps))))


def restored_everywhere(step: int, failure: str | None) -> str | None:
  """None when `step` restored in every process; else the first failing process's one-line `failure` (prefixed
  with its index when several processes run), the same in every process."""
  if jax.process_count() == 1:
    return failure
  failures = distributed.every_process(f"restore {step}", failure or "")
  return next((f"process {i}: {f}" for i, f in enumerate(failures) if f), None)
