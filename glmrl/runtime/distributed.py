"""Several processes, one run: `jax.distributed` set up before any array exists.

Explicit with `--coordinator_address=HOST:PORT --num_processes=N --process_id=I` (any cluster, or
processes on one machine); detected otherwise on SLURM (several tasks) and Cloud TPU pods (several
worker hostnames), where `jax.distributed.initialize()` reads the rest from the environment. On CPUs
the processes talk over gloo (loopback on one machine) and run one program at a time
(`one_program_at_a_time`).

Every process runs the same program on the same host data (the prompt iterator and PRNG keys are
deterministic), places its own devices' shards of each batch (`sharding.put`), computes host-side
rewards for its own samples, and writes its shards of each checkpoint; process 0 alone writes
metrics, images and the run's JSON records. What they decide together (a refusal, the step to stop at, the step
restored) is `agreement`'s; how each watches the others (a peer's exit, a lost process), `peers`'.
"""

from __future__ import annotations

import collections
import os
import time

import jax
from absl import logging

from glmrl.errors import UserError
from glmrl.runtime import peers
from glmrl.runtime import quiet_stderr
from glmrl.runtime import rendezvous


# What a process started by `srun` holds (jax's SlurmCluster reads them); an `salloc` shell has SLURM_NTASKS alone.
SLURM_TASK = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID")


def detected() -> bool:
  """True in a task of a multi-task SLURM job step or on a multi-host Cloud TPU slice. A shell of a SLURM
  allocation (`salloc`) with SLURM_NTASKS > 1 but no task of a step is one process, said in one line."""
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    missing = [v for v in SLURM_TASK if v not in os.environ]
    if not missing:
      return True
    logging.info("SLURM_NTASKS=%s but this process is no task of a job step (no %s): one process; `srun python "
                 "main.py ...` starts the job's tasks", os.environ["SLURM_NTASKS"], ", ".join(missing))
  return len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1


# How long the processes of a run wait for each other to start (main.py's --distributed_timeout).
START_TIMEOUT_S = 300
# How long a process may send no heartbeat before the coordination service counts it lost (main.py's
# --distributed_heartbeat_timeout; JAX's default).
HEARTBEAT_TIMEOUT_S = 100


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: int = START_TIMEOUT_S, facts: dict | None = None,
               heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S) -> bool:
  """Starts jax.distributed when several processes run; nothing for a single process. True when the processes
  were detected from the environment: their `facts` are the caller's to compare (`agreement.same_facts`, which
  builds on this module).

  With explicit flags the processes first meet (`glmrl.runtime.rendezvous.meet`, within `timeout_s`) and compare `facts`
  (mode, workdir, config, versions: what every process must hold equally), so that a launch mistake is one UserError
  in the processes it concerns instead of a hang or an abort inside jax; detected launches (SLURM, Cloud TPU)
  compare them once jax.distributed runs.

  JAX's preemption service stays off: its SIGTERM handler (XLA's, in C++) would replace glmrl's, which stops every
  process at one step on SIGTERM and SIGINT alike, also mid-compile (glmrl.checkpoint.signals). The coordination
  service runs recoverable: a lost process is marked so after `heartbeat_timeout_s` instead of aborting every
  other one inside XLA, and `glmrl.runtime.peers` ends them with one line."""
  explicit = (coordinator_address, num_processes, process_id)
  launched = any(v is not None for v in explicit)  # by the flags; else detected from the environment
  if launched:
    if any(v is None for v in explicit):
      raise UserError("--coordinator_address, --num_processes and --process_id go together "
                      f"(got {coordinator_address!r}, {num_processes!r}, {process_id!r})")
    if not 0 <= process_id < num_processes:
      raise UserError(f"--process_id={process_id} must be in [0, --num_processes={num_processes})")
    if num_processes == 1:
      return False
  elif not detected():
    return False
  # Collectives of the CPU backend (the compute backend of CPU runs); accelerators bring their own.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_enable_preemption_service", False)
  jax.config.update("jax_enable_recoverability", True)
  facts = {**rendezvous.launch_facts(), **(facts or {})}
  if launched:
    rendezvous.meet(coordinator_address, num_processes, process_id, timeout_s, facts)
    kwargs = dict(coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id)
  else:
    kwargs = {}
  with quiet_stderr.without(_RECOVERABLE_NOTICE):
    jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s, heartbeat_timeout_seconds=heartbeat_timeout_s)
  if jax.default_backend() == "cpu":
    one_program_at_a_time()
  return not launched


# What XLA's coordination service logs once, at its start, when it runs recoverable (glmrl's choice, above).
_RECOVERABLE_NOTICE = r"^W\d+ [\d:.]+ +\d+ coordination_service\.cc:\d+\] .*Using experimental recoverable task feature.*$"


# The jax version the CPU process-group patches below were written for (requirements.txt pins it): they replace
# internals, which a jax release may rename or change without notice.
PATCHED_JAX = "0.10.2"


def _internals():
  """(pjit, pxla): jax's modules holding the internals `one_program_at_a_time` replaces, for the pinned jax only;
  otherwise one clear error naming the version and what is missing, before any collective runs."""
  from jax._src import pjit  # pylint: disable=import-outside-toplevel
  from jax._src.interpreters import pxla  # pylint: disable=import-outside-toplevel

  needed = ((pjit, "_get_fastpath_data"), (pxla.ExecuteReplicated, "__call__"), (pxla.MeshExecutable, "create_cpp_call"))
  # Defined by the owner itself: an inherited method would take the replacement without being what dispatches.
  missing = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in needed if name not in vars(owner)]
  if jax.__version__ != PATCHED_JAX or missing:
    raise UserError(f"several processes on CPUs need jax=={PATCHED_JAX} (requirements.txt), whose internals glmrl "
                    f"patches there; this is jax {jax.__version__}" + (f", without {', '.join(missing)}" if missing else ""))
  return pjit, pxla


def one_program_at_a_time() -> None:
  """From now on each program this process runs has finished before the next one starts.

  XLA:CPU runs a program's per-device parts on a thread pool, and two programs without data between them run at
  the same time. Its collectives across processes go through gloo without tags (XLA's
  backends/cpu/collectives/gloo_communicator.cc: "how to do tags?"), so two programs in flight at once exchange
  their messages over the same pairs in whatever order each process's threads reach them: one process's
  all-reduce meets the other's all-gather ("Received data size doesn't match expected size. Is there a
  distributed collective mismatch in your code?") or both wait for ever. Two processes x 4 CPU devices that
  dispatch four independent all-reduces back to back hang (tests/runtime/test_distributed.py). Accelerators run a
  device's programs in the order they were dispatched, which every process shares; they keep JAX's asynchronous
  dispatch.

  JAX has no switch for this (`jax_cpu_enable_async_dispatch` leaves multi-device programs asynchronous), so two
  of its internals change, for the jax version requirements.txt pins (`_internals` refuses another): every call,
  of a jitted function or of a program compiled ahead of time (`.lower().compile()`, whose C++ fast path
  `MeshExecutable.create_cpp_call` builds), takes the Python dispatch path, and that path waits for the program's
  outputs. What it
  costs, on CPUs only: the slower dispatch path and the overlap of host work with the devices' work."""
  pjit, pxla = _internals()
  execute = pxla.ExecuteReplicated.__call__
  if getattr(execute, "one_at_a_time", False):
    return

  def execute_and_wait(self, *args):
    out = execute(self, *args)
    jax.block_until_ready(out)
    return out

  execute_and_wait.one_at_a_time = True
  pjit._get_fastpath_data = lambda *args, **kwargs: None  # pylint: disable=protected-access
  pxla.MeshExecutable.create_cpp_call = lambda self, params: None  # Compiled.__call__ then takes Compiled.call
  pxla.ExecuteReplicated.__call__ = execute_and_wait


def all_agree(name: str, value: bool) -> bool:
  """True when `value` is True in every process (each tells the others through the coordination service, no
  device collective); `value` in a single process."""
  return all(v == "1" for v in every_process(name, "1" if value else "0"))


def smallest(name: str, value: int) -> int:
  """The smallest of every process's `value`, the same number in every process (through the coordination
  service): e.g. the device memory a choice must fit on every host."""
  return min(int(v) for v in every_process(name, str(value)))


def every_process(name: str, value: str, forget_previous: bool = False) -> list[str]:
  """Every process's `value`, in process order, in every process. `forget_previous`: this process's value of the
  previous exchange of `name` is deleted (every process has read it once this one is complete), so that an
  exchange made at every step keeps two keys per process in the coordination service, not one per step."""
  if jax.process_count() == 1:
    return [value]
  client, key = _client(), _key(name)
  client.key_value_set(f"{key}/{jax.process_index()}", value)
  timeout_ms = BARRIER_TIMEOUT_S * 1000
  values = [client.blocking_key_value_get(f"{key}/{i}", timeout_ms) for i in range(jax.process_count())]
  if forget_previous and _asked[name] > 1:
    client.key_value_delete(f"glmrl/{name}/{_asked[name] - 1}/{jax.process_index()}")
  return values


def from_main(name: str, value: str) -> str:
  """Process 0's `value`, in every process (through the coordination service)."""
  if jax.process_count() == 1:
    return value
  client, key = _client(), _key(name)
  if is_main():
    client.key_value_set(key, value)
    return value
  return client.blocking_key_value_get(key, BARRIER_TIMEOUT_S * 1000)


_asked = collections.Counter()


def _key(name: str) -> str:
  """A key of its own for each time the processes exchange `name` (they do so in the same order)."""
  _asked[name] += 1
  return f"glmrl/{name}/{_asked[name]}"


def _client():
  from jax._src import distributed as jax_distributed  # pylint: disable=import-outside-toplevel

  return jax_distributed.global_state.client


def is_main() -> bool:
  """The process that writes the run's logs, images and records."""
  return jax.process_index() == 0


# How long a process waits at `barrier` for the others: building the models or loading a checkpoint can take
# one host minutes longer than another.
BARRIER_TIMEOUT_S = 1800


def barrier(name: str) -> None:
  """Every process waits here for the others, through the coordination service (no device collective).

  On CPUs the first cross-process collective sets up gloo, whose rendezvous gives a late peer 30 s, less than
  processes sharing few cores may take apart to build their models (docs/benchmarks.md, "Measurements behind the
  library's defaults"). Meeting here first starts that rendezvous together."""
  if jax.process_count() > 1:
    _client().wait_at_barrier(f"glmrl: {name}", BARRIER_TIMEOUT_S * 1000)


def finished() -> None:
  """Every process waits here for the others once a mode's work is done, so they reach jax.distributed's
  shutdown barrier together: process 0's host-side writes (metrics, images, records, exports) would
  otherwise keep it past that barrier's deadline while the others already wait there."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("glmrl: mode finished")
    leave()


def leave() -> None:
  """This process leaves the coordination service, once every process has its run's outcome (finished, or refused
  together): the others first, process 0 (the service's host) once they have left. The service, taken down before a
  process has left, ends that process inside XLA, with its stack; at exit jax tears down its backends first and
  shuts down after, so a process slow or dying in that teardown would hold the others."""
  if jax.process_count() == 1 or _client() is None:
    return
  peers.leave()
  if is_main():
    client, others = _client(), set(range(1, jax.process_count()))
    deadline = time.monotonic() + peers.LEAVE_WAIT_S
    # The service answers once every live process has asked, or left: the others do not ask, they leave.
    while time.monotonic() < deadline:
      try:
        if not others & set(client.get_live_nodes(list(range(jax.process_count())))):
          break
      except Exception:  # pylint: disable=broad-except  # nothing to wait for
        break
  jax.distributed.shutdown()
