"""Orbax's and TensorStore's stray errors around a failed restore or a failed background save, dropped so that
the run reports each failure once, in one line (`OrphanedReads`)."""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
import sys

from absl import logging

from glmrl.runtime.thread_errors import os_error_raised_in


class OrphanedReads:
  """Drops the stray errors of a failed restore's orphaned reads.

  Orbax closes its event loop on the first read error while TensorStore still completes the
  step's other reads; each completion then fails to reach the closed loop, or its coroutine is
  closed with the read error, or its future is collected unretrieved, and each prints a traceback
  (hundreds of lines for one truncated file), before and after the step has been reported.
  Dropped, while a restore runs or once one failed: 'Event loop is closed' errors (a live
  restore's loop is open, so they come from a failed one) and the errors and asyncio log records
  naming a step folder that is being restored or failed to. Anything else goes where it went
  before (so nothing changes for a run whose restores succeed).
  """

  def __init__(self):
    self.current: str | None = None  # the step folder being restored
    self.failed: set[str] = set()
    self.saving: set[str] = set()  # checkpoints folders being saved into (`TrainCheckpointer`)
    self.installed = False

  @contextlib.contextmanager
  def restoring(self, step_path: str):
    self._install()
    self.current = step_path.rstrip(os.sep) + os.sep
    try:
      yield
    except BaseException:
      self.failed.add(self.current)
      raise
    finally:
      self.current = None

  def watch_saves(self, directory: str) -> None:
    self._install()
    self.saving.add(directory)

  def _names_step(self, text: str) -> bool:
    # A failed background write names its step's temporary folder; the next save or close reports it in one line.
    if ".orbax-checkpoint-tmp" in text and any(d in text for d in self.saving):
      return True
    return any(p in text for p in (*self.failed, *([self.current] if self.current else [])))

  def _install(self):
    if self.installed:
      return
    self.installed = True
    previous = sys.unraisablehook

    def hook(unraisable):
      exc = unraisable.exc_value
      loop_closed = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
      if not ((loop_closed and (self.current or self.failed or self.saving)) or self._names_step(str(exc))):
        previous(unraisable)

    sys.unraisablehook = hook
    about_a_step = lambda r: self._names_step(r.getMessage() + str(r.exc_info[1] if r.exc_info else ""))
    orbax_os_error = lambda r: os_error_raised_in(r.exc_info[1] if r.exc_info else None, "orbax")
    # A write that failed on a full disk is also logged by asyncio ('Future exception was never retrieved') when
    # the run stops; it names no folder, only its OSError raised in Orbax.
    std_logging.getLogger("asyncio").addFilter(
        lambda r: not (about_a_step(r) or (self.saving and orbax_os_error(r))))
    # Orbax logs a failed background save from each of its threads and again when it is waited for, traceback
    # and all, before the next save or close reports it once (`TrainCheckpointer._surfaced`). Some of those
    # records name no folder (a full disk while writing a step's JSON metadata): their OSError identifies them.
    logging.get_absl_logger().addFilter(
        lambda r: not ("orbax" in r.pathname and self.saving and (
            about_a_step(r) or any(d in r.getMessage() for d in self.saving) or orbax_os_error(r))))


ORPHANED_READS = OrphanedReads()
