"""TensorBoard event files through tensorboardX, written on the calling thread, so that a full disk can never stall
the run.

tensorboardX's SummaryWriter writes from a background thread fed by a bounded queue: once a write fails (a full
disk) that thread dies, nothing drains the queue, and the run's next `add_*` once the queue is full, or `close()`
(which queues a stop signal and joins), waits on it for ever. Here tensorboardX's own summaries and its synchronous
`EventsWriter` (TFRecord framing, the file's name and version event) are called by the caller (microseconds a
scalar; an image's PNG encoding), and the first OSError stops the events with one warning line: the run goes on,
metrics.jsonl keeps every row.

tensorboardX imports torch where torch is installed (2-3 s): it is imported at the first event, so that only the
process that writes events (process 0 of a run that logs) pays for it, and a run that fails its checks never does.
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import logging

STOPPED = "TensorBoard events stopped: %s (metrics.jsonl keeps every row)"
FLUSH_SECONDS = 10.0  # how stale the event file may get between explicit flushes


class Events:
  """`add_scalar`, `add_image`, `flush` and `close` into an event file in `logdir` (TensorBoard's naming, opened at
  the first event); each a no-op once a write has failed (`stopped`)."""

  def __init__(self, logdir: str):
    self._logdir = logdir
    self._writer = None  # tensorboardX's EventsWriter, from the first event on
    self._tbx = None  # (tensorboardX.summary, its Event proto), imported with the writer
    self._stopped = False
    self._last_flush = time.monotonic()

  @property
  def stopped(self) -> bool:
    return self._stopped

  def _guarded(self, write):
    """write()'s result; on an OSError, None and the events stopped."""
    try:
      return write()
    except OSError as e:
      logging.warning(STOPPED, e)
      self._stopped, self._writer = True, None
      return None

  def _open(self):
    from tensorboardX import summary  # pylint: disable=import-outside-toplevel
    from tensorboardX.event_file_writer import EventsWriter  # pylint: disable=import-outside-toplevel
    from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel

    self._tbx = (summary, event_pb2)
    return EventsWriter(os.path.join(self._logdir, "events"))

  def _add(self, summary_of, step: int) -> None:
    """Appends the event of `summary_of(tensorboardX.summary)` at `step`."""
    if self._stopped:
      return
    if self._writer is None:
      self._writer = self._guarded(self._open)
      if self._writer is None:
        return
    summary, event_pb2 = self._tbx
    event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_of(summary))
    self._guarded(lambda: self._writer.write_event(event))
    if time.monotonic() - self._last_flush > FLUSH_SECONDS:
      self.flush()

  # Tags as metrics.jsonl and W&B spell them: tensorboardX's `summary.scalar` and `summary.image` would rename the
  # characters a TensorFlow node name may not hold.
  def add_scalar(self, tag: str, value: float, step: int) -> None:
    self._add(lambda summary: summary.Summary(value=[summary.Summary.Value(tag=tag, simple_value=value)]), step)

  def add_image(self, tag: str, image_HxWxC, step: int) -> None:
    """A uint8 image of 3 or 4 channels, PNG-encoded."""
    self._add(lambda summary: summary.Summary(value=[summary.Summary.Value(
        tag=tag, image=summary.make_image(np.asarray(image_HxWxC, np.uint8)))]), step)

  def flush(self) -> None:
    self._last_flush = time.monotonic()
    if self._writer is not None:
      self._guarded(self._writer.flush)

  def close(self) -> None:
    if self._writer is not None:
      self._guarded(self._writer.close)
    self._writer = None
