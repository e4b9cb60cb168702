"""The other processes of a run, watched from each one (two daemon threads, started once jax.distributed runs).

- A peer that exits at once on a signal (nothing to save yet: setup, a compile, --mode=eval or generate) or on an
  error only it met says so first (`announce_exit`); every other process then exits too, with the same status and
  one line naming it, instead of waiting for it at the next collective; process 0 ends last (`exit_process`).
- A peer that is lost (killed, out of memory, its host gone) stops sending the coordination service its heartbeats;
  after `--distributed_heartbeat_timeout` seconds the service (recoverable, `distributed`) counts it lost, and
  every surviving process ends with one line naming it and the run's last complete checkpoint, exit status 1, instead
  of a collective's traceback, the coordination service's errors and XLA's abort. A lost process 0 takes the
  coordination service with it: XLA ends the others within seconds with its own message.
"""

from __future__ import annotations

import json
import os
import threading
import time

import jax

from glmrl.runtime import quiet_stderr

EXIT_KEY = "glmrl/exit"
LEFT_KEY = "glmrl/left"
POLL_S = 1.0  # how often each process asks the coordination service which processes are alive
EXIT_WAIT_S = 10.0  # how long process 0, ending, waits for the others to end first
LOST_STATUS = 1

LEAVE_WAIT_S = 30  # the longest a process waits for another to leave

_watching = threading.Event()
_threads = []
_watched = {}  # what `watch` was given: "resume" (where the run resumes from, said when a peer is lost), "heartbeat_s"


def _state():
  from jax._src import distributed as jax_distributed  # pylint: disable=import-outside-toplevel

  return jax_distributed.global_state


def _client():
  return _state().client


def watch(on_peer_exit, resume, heartbeat_s: int | None = None) -> None:
  """Starts watching the other processes (nothing in a single process). `on_peer_exit(notice)`: what this process
  does when a peer exits at once (`announce_exit`'s notice, with the peer's "process"); it does not return.
  `resume()`: where the run resumes from, said when a peer is lost (e.g. "the last complete checkpoint is step 4
  (DIR)", `glmrl.checkpoint.manager.resume_point`); `heartbeat_s`: the coordination service's heartbeat timeout."""
  if jax.process_count() == 1 or _watching.is_set():
    return
  _watched.update(resume=resume, heartbeat_s=heartbeat_s)
  _watching.set()
  _threads[:] = [threading.Thread(target=_watch_exits, args=(on_peer_exit,), name="peer-exits", daemon=True),
                 threading.Thread(target=_watch_liveness, name="peer-liveness", daemon=True)]
  for thread in _threads:
    thread.start()


def watching() -> bool:
  """Whether this process watches peers (a multi-process run, from `watch` until `leave`)."""
  return _watching.is_set()


def leave() -> None:
  """This process is leaving the coordination service in order: the others do not count it lost, and its watching
  threads have returned (a thread still inside a call of the coordination client would be ended inside C++ when
  the interpreter exits: an abort). Each of their calls returns within POLL_S, or once every live process asked
  (get_live_nodes) or left."""
  if not _watching.is_set():
    return
  _watching.clear()
  try:
    _client().key_value_set(f"{LEFT_KEY}/{jax.process_index()}", "1")
  except Exception:  # pylint: disable=broad-except  # the service is gone: nobody is left to tell
    return
  for thread in _threads:
    thread.join(LEAVE_WAIT_S)


def _left(client, process: int) -> bool:
  """Whether `process` left the run in order (`leave`)."""
  try:
    return bool(client.key_value_try_get(f"{LEFT_KEY}/{process}"))
  except Exception:  # pylint: disable=broad-except  # no such key (or no service)
    return False


def announce_exit(notice: dict) -> None:
  """Tells the other processes that this one exits now (`exit_process` follows). `notice`: {"signal": its name,
  "what": why nothing is saved} or {"error": the one line it ends with, "status"}. The first notice stands: a
  process announcing after it exits by its own."""
  if not _watching.is_set():
    return
  try:
    _client().key_value_set(EXIT_KEY, json.dumps({"process": _state().process_id, **notice}))
  except Exception:  # pylint: disable=broad-except  # another process announced first
    pass


def exit_process(status: int, lost: tuple = ()) -> None:
  """Ends this process with `status`, process 0 (the coordination service's host) last: the service gone before
  another process has ended ends that one inside XLA, with its stack. The others say they are ending; process 0
  waits for each (but the `lost` ones) for EXIT_WAIT_S at most."""
  client, me, n = _client(), _state().process_id, _state().num_processes  # no backend started for these
  if client is not None and n > 1:
    try:
      if me != 0:
        client.key_value_set(f"{EXIT_KEY}/done/{me}", "1")
      else:
        deadline = time.monotonic() + EXIT_WAIT_S
        for i in range(1, n):
          left_ms = int((deadline - time.monotonic()) * 1000)
          if i in lost or left_ms <= 0:
            continue
          try:
            client.blocking_key_value_get(f"{EXIT_KEY}/done/{i}", left_ms)
          except Exception:  # pylint: disable=broad-except  # that process is gone already
            pass
        time.sleep(0.2)  # from its last call to its end
    except Exception:  # pylint: disable=broad-except  # the service is gone: nothing to wait for
      pass
  os._exit(status)  # pylint: disable=protected-access  (the main thread may wait inside a collective for ever)


def _watch_exits(on_peer_exit) -> None:
  client, me = _client(), jax.process_index()
  while _watching.is_set():
    try:
      notice = json.loads(client.blocking_key_value_get(EXIT_KEY, int(POLL_S * 1000)))
    except Exception:  # pylint: disable=broad-except  # no notice yet, or the service is going away
      time.sleep(0.05)  # an error without the wait: not a busy loop
      continue
    if notice.get("process") == me:
      return
    on_peer_exit(notice)
    return


def _watch_liveness() -> None:
  """Asks the coordination service which processes are alive, every POLL_S: a question every live process asks
  together (the service answers once each has), so that only this thread asks it."""
  client, n = _client(), jax.process_count()
  while True:
    time.sleep(POLL_S)
    try:
      live = client.get_live_nodes(list(range(n)))
    except Exception:  # pylint: disable=broad-except  # the coordination service (process 0) is gone
      if not _watching.is_set():
        return
      live = {i: 0 for i in range(n) if i != 0}
    if not _watching.is_set():  # leaving (`leave`)
      return
    gone = set(range(n)) - set(live)  # this process too when the service counted it lost (`_lost_line`)
    lost = [i for i in sorted(gone) if not _left(client, i)]
    if lost and _watching.is_set():
      _end(lost)


def _lost_line(me: int, lost: list[int], heartbeat_s: int | None, where: str) -> str:
  """The one line a surviving process ends with (`where`: where the run resumes from). The service counting this
  very process lost (alive, as it writes this) means heartbeats came late, not a process gone: a host too busy to
  send them within the timeout (both of a heartbeat's chances: JAX sends one every half timeout)."""
  who = f"process {lost[0]}" if len(lost) == 1 else f"processes {', '.join(map(str, lost))}"
  why = "sent no heartbeat" + (f" for {heartbeat_s} s" if heartbeat_s else "")
  if me in lost:
    now = f" (now {heartbeat_s} s)" if heartbeat_s else ""
    return (f"error: process {me}: the coordination service counted {who} lost ({why}), this live one included: "
            f"their heartbeats came late, a host too busy to send them; raise --distributed_heartbeat_timeout{now}; "
            f"{where}: start every process again to resume")
  if lost == [0]:
    why = "its coordination service stopped answering"
  return (f"error: process {me}: {who} of the run is lost ({why}: killed, out of memory, or its host is gone); "
          f"{where}: start every process again to resume")


def _end(lost: list[int]) -> None:
  line = _lost_line(jax.process_index(), lost, _watched["heartbeat_s"], _watched["resume"]())
  os.write(quiet_stderr.console_fd(), (line + "\n").encode())
  exit_process(LOST_STATUS, tuple(lost))


def wait_for_loss(timeout_s: float) -> None:
  """Returns after `timeout_s` unless a lost peer ends this process first: what a process does with an error raised
  by a collective (a peer's connection reset) before it reports the error as its own."""
  deadline = time.monotonic() + timeout_s
  while _watching.is_set() and time.monotonic() < deadline:
    time.sleep(POLL_S / 4)
