"""TensorBoard event files read back by TensorBoard's own reader (the `tensorboard` package's record reader, which
TensorBoard reads with where TensorFlow is not installed: each record's two masked CRC32Cs checked, a torn record
refused; and its `Event` proto), not by the library that writes them (tensorboardX)."""

from tensorboard.compat import tf
from tensorboard.compat.proto import event_pb2


def read_events(path) -> list:
  """Every `Event` of a TFRecord file; a bad checksum or a torn record raises (DataLossError)."""
  reader, events = tf.pywrap_tensorflow.PyRecordReader_New(filename=str(path)), []
  while True:
    try:
      reader.GetNext()
    except tf.errors.OutOfRangeError:  # the end of the file, at a record's boundary
      return events
    events.append(event_pb2.Event.FromString(reader.record()))
