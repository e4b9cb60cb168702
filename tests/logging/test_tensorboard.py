"""TensorBoard events on a disk that fills: the run's writes and close return, the events stop, nothing blocks."""

import threading

from glmrl.logging.tensorboard import Events


def test_a_full_disk_stops_the_events_and_never_blocks_the_run(small_disk):
  events = Events(str(small_disk("64k")))
  done = threading.Event()

  def run():
    # ~40 bytes an event: the 64 KiB disk fills after ~1,600, with many queued behind the failed write.
    for step in range(20_000):
      events.add_scalar("reward/mean", 0.5, step)
    events.flush()
    events.close()
    done.set()

  threading.Thread(target=run, daemon=True).start()
  assert done.wait(timeout=120), "a write or close blocked behind TensorBoard's dead writer thread"
  assert events.stopped
