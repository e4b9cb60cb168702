"""SIGTERM / Ctrl-C / SIGHUP: exit at once while nothing is unsaved; else finish the current step, save, and exit.

Python runs a signal handler only when the main thread is back in the interpreter, which a minutes-long XLA
compile or a model build is not. So the C-level handler's wake-up byte (`signal.set_wakeup_fd`) is read by a
watcher thread: while the run holds nothing unsaved (setup, a restore, the first step with its compile), the
watcher runs the cleanups (the workdir lock) and ends the process with 128 + the signal at once. Once a step
has finished, the signal only sets the flag the loop polls between steps: the step in flight is finished and
saved, as a scheduler's grace period expects. A second signal is answered with one line (the save goes on); a third
aborts at once, without saving, its cleanups run. SIGHUP (the terminal of an ssh session closed) is a SIGTERM,
unless the run was started to ignore it (`nohup`).

With several processes (glmrl.runtime's peers and agreement), a signal reaches one process or all of them at different
moments, and they still end as one: an immediate exit is announced to the others, which exit at once too with the
same status; a flag set by a signal is read by every process after every step (`agreement.stop_signal`), so all of
them stop after the same step, save it together and exit with the same status.
"""

import os
import signal
import sys
import threading

from absl import logging

from glmrl.runtime import quiet_stderr


class StopSignal:
  """Context manager for SIGTERM and SIGINT (see the module docstring).

  `immediate=True` until `work_in_progress()`: the run then has work to save, and a signal sets the flag
  (`bool(stop)`, `stop.received`) instead. `cleanup`: callables run before an immediate exit.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
  ABORT_AFTER = 3  # the signal, of those received once a step has finished, that aborts without saving
  _active = []  # the contexts in force, innermost last: a peer's exit runs the innermost one's cleanups

  def __init__(self, cleanup=(), what: str = "nothing to save yet"):
    self.received = None
    self._cleanup, self._what = tuple(cleanup), what
    self._previous = {}
    self._immediate = True
    self._mutex = threading.Lock()
    self._write_fd = -1
    self._previous_fd = -1
    self._insisted = 0  # signals received since the run had work to save
    self._ttys = ()  # stdout and stderr where they are a terminal, dropped on its hang-up

  def work_in_progress(self) -> None:
    """From now on a signal waits for the loop (finish the step, save)."""
    with self._mutex:
      self._immediate = False

  def _exit_now(self, signum: int, peer: dict | None = None, what: str | None = None) -> None:
    """Ends the process with 128 + `signum` after its cleanups; `peer`: the notice of the process whose signal this
    is (glmrl.runtime.peers), else this process's own signal, announced to the others first (`what`: the line's
    reason, default the context's)."""
    name = signal.Signals(signum).name
    if peer is None:
      what = what or self._what
      _say(f"{name} received: {what}; exiting")
      from glmrl.runtime import peers  # pylint: disable=import-outside-toplevel  (jax: with several processes only)

      peers.announce_exit({"signal": name, "what": what})
    else:
      _say(f"{name} received by process {peer['process']}: {peer['what']}; exiting")
    self._end(128 + signum)

  def _end(self, status: int) -> None:
    for fn in self._cleanup:
      try:
        fn()
      except Exception as e:  # pylint: disable=broad-except  (exiting regardless)
        _say(f"while exiting: {e}")
    _exit(status)

  @classmethod
  def peer_exited(cls, notice: dict) -> None:
    """A peer process exits at once (glmrl.runtime.peers' notice): on a signal, or on an error only it found; this
    one does so too, with the same status and line, after the cleanups of its innermost context."""
    if notice.get("signal"):
      signum = signal.Signals[notice["signal"]].value
      if cls._active:
        cls._active[-1]._exit_now(signum, peer=notice)  # pylint: disable=protected-access
      _say(f"{notice['signal']} received by process {notice['process']}: {notice['what']}; exiting")
      _exit(128 + signum)
    _say(f"error: process {notice['process']}: {notice['error']}")
    if cls._active:
      cls._active[-1]._end(notice.get("status", 2))  # pylint: disable=protected-access
    _exit(notice.get("status", 2))

  def _watch(self, read_fd: int) -> None:
    """Reads the signals as they arrive, whatever the main thread is doing: an immediate exit, or once there is
    work to save the second signal's line and the third's abort (the first is the handler's flag)."""
    try:
      while data := os.read(read_fd, 1):  # b"" once the write end closed: the context ended
        if data[0] not in [int(s) for s in self.SIGNALS]:
          continue
        with self._mutex:
          if self._immediate:
            self._exit_now(data[0])
          self._insisted += 1
          name = signal.Signals(data[0]).name
          if data[0] == signal.SIGHUP:
            self._drop_terminal()
          if self._insisted == self.ABORT_AFTER:
            self._exit_now(data[0], what=f"signal {self.ABORT_AFTER} since the step in flight: aborting without "
                                         "saving it")
          elif self._insisted > 1:
            _say(f"{name} received again: already finishing the step to save it; a third signal aborts without "
                 "saving")
    finally:
      os.close(read_fd)

  def _drop_terminal(self) -> None:
    """After a hang-up the terminal answers every write with EIO, which would end the run before its save: its
    lines go to /dev/null from now on (a stream redirected to a file keeps them)."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in self._ttys:
      os.dup2(null, fd)
    os.close(null)
    self._ttys = ()

  def _handle(self, signum, frame):
    del frame
    with self._mutex:
      immediate = self._immediate
    if immediate or self.received is not None:  # the watcher is ending the process, or answers the repeat
      return
    self.received = signal.Signals(signum).name
    logging.warning("%s received: saving a checkpoint after the current step, then exiting.", self.received)

  def __enter__(self):
    self._ttys = tuple(fd for fd in (1, 2) if os.isatty(fd))  # now: a hung-up terminal is no tty any more
    read_fd, self._write_fd = os.pipe()
    os.set_blocking(self._write_fd, False)
    for sig in self.SIGNALS:
      if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
        continue  # started under nohup: the hang-up stays ignored
      self._previous[sig] = signal.signal(sig, self._handle)
    self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
    threading.Thread(target=self._watch, args=(read_fd,), name="stop-signal", daemon=True).start()
    StopSignal._active.append(self)
    return self

  def __exit__(self, *exc):
    StopSignal._active.remove(self)
    with self._mutex:  # no immediate exit from here on: the run is returning by itself
      self._immediate = False
    signal.set_wakeup_fd(self._previous_fd)
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    os.close(self._write_fd)  # the watcher reads end-of-file and returns
    return False

  def __bool__(self):
    return self.received is not None


def _say(line: str) -> None:
  """A line on the console's stderr, also while a library's output is held back (glmrl.runtime.quiet_stderr); none
  where the console is gone (a closed terminal's SIGHUP)."""
  try:
    os.write(quiet_stderr.console_fd(), (line + "\n").encode())
  except OSError:
    pass


def _exit(status: int) -> None:
  """Ends the process at once (no unwinding: the main thread may be inside XLA); with several processes, process 0
  last (glmrl.runtime.peers)."""
  if "jax" in sys.modules:
    from glmrl.runtime import peers  # pylint: disable=import-outside-toplevel

    peers.exit_process(status)
  os._exit(status)  # pylint: disable=protected-access
