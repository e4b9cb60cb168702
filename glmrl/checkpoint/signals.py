"""SIGTERM / Ctrl-C: finish the current step, save, and exit cleanly."""

import signal

from absl import logging


class StopSignal:
  """Context manager that turns SIGTERM and SIGINT into a flag polled between steps."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.received = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self.received is not None:  # A second signal: the user insists.
      raise KeyboardInterrupt
    self.received = signal.Signals(signum).name
    logging.warning("%s received: saving a checkpoint after the current step, then exiting.", self.received)

  def __enter__(self):
    for sig in self.SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    return False

  def __bool__(self):
    return self.received is not None
