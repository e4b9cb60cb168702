"""TensorBoard event files read back with tensorboardX's protos and checksums (an implementation independent of
glmrl.logging.event_file's)."""

import struct

from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c


def read_events(path) -> list:
  """Every `Event` of a TFRecord file, each record's two masked CRC32Cs checked."""
  data = open(path, "rb").read()
  events, pos = [], 0
  while pos < len(data):
    header = data[pos:pos + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
    payload = data[pos + 12:pos + 12 + length]
    (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
    assert header_crc == masked_crc32c(header) and payload_crc == masked_crc32c(payload), (path, pos)
    events.append(event_pb2.Event.FromString(payload))
    pos += 16 + length
  assert pos == len(data), (path, pos, len(data))
  return events
