"""TensorBoard event files written on the calling thread, so that a full disk can never stall the run.

A writer that writes from a background thread fed by a bounded queue (tensorboardX's SummaryWriter) blocks for
ever once a write fails (a full disk): that thread dies, nothing drains the queue, and the run's next `add_*` once
the queue is full, or `close()` (which queues a stop signal and joins), waits on it. Here each event is serialized
and appended to the file by the caller (`glmrl.logging.event_file`: microseconds a scalar; an image's PNG
encoding), and the first OSError stops the events with one warning line: the run goes on, metrics.jsonl keeps
every row.
"""

from __future__ import annotations

import time

from absl import logging

from glmrl.logging import event_file

STOPPED = "TensorBoard events stopped: %s (metrics.jsonl keeps every row)"
FLUSH_SECONDS = 10.0  # how stale the event file may get between explicit flushes


class Events:
  """`add_scalar`, `add_image`, `flush` and `close` into an event file in `logdir` (TensorBoard's naming);
  each a no-op once a write has failed (`stopped`)."""

  def __init__(self, logdir: str):
    self._file: event_file.EventFile | None = None
    self._last_flush = time.monotonic()
    self._file = self._guarded(lambda: event_file.EventFile(logdir))

  @property
  def stopped(self) -> bool:
    return self._file is None

  def _guarded(self, write):
    """write()'s result; on an OSError, None and the events stopped."""
    try:
      return write()
    except OSError as e:
      logging.warning(STOPPED, e)
      self._file = None
      return None

  def _add(self, summary, step: int) -> None:
    if self._file is None:
      return
    event = event_file.event(int(step), summary=summary)
    self._guarded(lambda: self._file.write(event))
    if time.monotonic() - self._last_flush > FLUSH_SECONDS:
      self.flush()

  def add_scalar(self, tag: str, value: float, step: int) -> None:
    self._add(event_file.scalar_summary(tag, value), step)

  def add_image(self, tag: str, image_HxWxC, step: int) -> None:
    self._add(event_file.image_summary(tag, image_HxWxC), step)

  def flush(self) -> None:
    self._last_flush = time.monotonic()
    if self._file is not None:
      self._guarded(self._file.flush)

  def close(self) -> None:
    if self._file is not None:
      self._guarded(self._file.close)
    self._file = None
