"""TensorBoard's event file, written directly: TFRecord framing of `Event` protocol buffers, encoded by hand.

Only what a run logs is encoded: scalars (`Summary.Value.simple_value`) and PNG images (`Summary.Image`), as
TensorBoard's `event.proto` and `summary.proto` number their fields. A library for this (tensorboardX) imports
torch when it is installed, 2-3 s of every process start for two message types (each process of a pod run,
every `--mode`).
"""

from __future__ import annotations

import io
import os
import socket
import struct
import time

from PIL import Image

FILE_VERSION = b"brain.Event:2"


def _crc32c_table() -> tuple[int, ...]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli's polynomial, reflected
    table.append(crc)
  return tuple(table)


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """TFRecord's masked checksum (a CRC of data that holds CRCs is weak unmasked)."""
  crc = crc32c(data)
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
  """One TFRecord: length, its masked CRC, the data, its masked CRC (little-endian)."""
  header = struct.pack("<Q", len(data))
  return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


# Protocol buffer wire format: a key (field number << 3 | wire type), then the value.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
  value &= (1 << 64) - 1  # negative int64s take ten bytes, as two's complement
  out = bytearray()
  while True:
    low, value = value & 0x7F, value >> 7
    out.append(low | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
  key = _varint(number << 3 | wire_type)
  if wire_type == _BYTES:
    return key + _varint(len(payload)) + payload
  return key + payload


def _int(number: int, value: int) -> bytes:
  return _field(number, _VARINT, _varint(value))


def event(step: int, *, summary: bytes | None = None, file_version: bytes | None = None,
          wall_time: float | None = None) -> bytes:
  """A serialized `Event` (wall_time = 1, step = 2, file_version = 3, summary = 5)."""
  out = _field(1, _FIXED64, struct.pack("<d", time.time() if wall_time is None else wall_time)) + _int(2, step)
  if file_version is not None:
    out += _field(3, _BYTES, file_version)
  if summary is not None:
    out += _field(5, _BYTES, summary)
  return out


def scalar_summary(tag: str, value: float) -> bytes:
  """A serialized `Summary` of one `Value` (tag = 1, simple_value = 2)."""
  value_ = _field(1, _BYTES, tag.encode()) + _field(2, _FIXED32, struct.pack("<f", value))
  return _field(1, _BYTES, value_)


def image_summary(tag: str, image_HxWxC) -> bytes:
  """A serialized `Summary` of one `Value` holding a PNG `Image` (height = 1, width = 2, colorspace = 3 as the
  channel count, encoded_image_string = 4) of a uint8 image."""
  height, width, channels = image_HxWxC.shape
  png = io.BytesIO()
  Image.fromarray(image_HxWxC[..., 0] if channels == 1 else image_HxWxC).save(png, format="PNG")
  image = _int(1, height) + _int(2, width) + _int(3, channels) + _field(4, _BYTES, png.getvalue())
  value_ = _field(1, _BYTES, tag.encode()) + _field(4, _BYTES, image)
  return _field(1, _BYTES, value_)


class EventFile:
  """`<logdir>/events.out.tfevents.<seconds>.<host>`, opened with TensorBoard's file-version event; `write`
  appends a serialized event, `flush` makes the file durable. OSErrors reach the caller."""

  def __init__(self, logdir: str):
    self.path = os.path.join(logdir, f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}")
    self._file = open(self.path, "wb")
    self.write(event(0, file_version=FILE_VERSION))

  def write(self, serialized_event: bytes) -> None:
    self._file.write(record(serialized_event))

  def flush(self) -> None:
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self) -> None:
    try:
      self.flush()
    finally:
      self._file.close()
