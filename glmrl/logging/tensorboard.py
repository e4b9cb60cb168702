"""TensorBoard event files written on the calling thread, so that a full disk can never stall the run.

tensorboardX's SummaryWriter writes from a background thread fed by a bounded queue. When a write fails (a full
disk) that thread dies, nothing drains the queue, and the run's next `add_*` once the queue is full, or `close()`
(which queues a stop signal and joins), blocks forever. Here each event is serialized and appended to the file
by the caller (microseconds a scalar; an image's PNG encoding ran on the caller's thread before as well), and
the first OSError stops the events with one warning line: the run goes on, metrics.jsonl keeps every row.
"""

from __future__ import annotations

import os
import time

from absl import logging
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2
from tensorboardX.summary import image, scalar

STOPPED = "TensorBoard events stopped: %s (metrics.jsonl keeps every row)"
FLUSH_SECONDS = 10.0  # how stale the event file may get between explicit flushes


class Events:
  """`add_scalar`, `add_image`, `flush` and `close` into an event file in `logdir` (TensorBoard's naming);
  each a no-op once a write has failed (`stopped`)."""

  def __init__(self, logdir: str):
    self._file: EventsWriter | None = None
    self._last_flush = time.monotonic()
    self._file = self._guarded(lambda: EventsWriter(os.path.join(logdir, "events")))

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
    event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
    self._guarded(lambda: self._file.write_event(event))
    if time.monotonic() - self._last_flush > FLUSH_SECONDS:
      self.flush()

  def add_scalar(self, tag: str, value: float, step: int) -> None:
    self._add(scalar(tag, value), step)

  def add_image(self, tag: str, image_HxWxC, step: int) -> None:
    self._add(image(tag, image_HxWxC, dataformats="HWC"), step)

  def flush(self) -> None:
    self._last_flush = time.monotonic()
    if self._file is not None:
      self._guarded(self._file.flush)

  def close(self) -> None:
    if self._file is not None:
      self._guarded(self._file.close)
    self._file = None
