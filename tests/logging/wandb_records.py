"""What an offline W&B run wrote: the history rows of its `run-<id>.wandb` files, read without W&B's reader (wandb
0.31 ships none). The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB
blocks of chunks, each a 7-byte header (CRC-32 of type and bytes, little-endian length, type: 1 full, 2 first, 3 middle, 4 last)
followed by its bytes; a chunk header never straddles a block (the block's tail is padding). Each whole record is a
serialized `wandb_internal_pb2.Record`."""

import glob
import json
import os
import struct
import time
import zlib

from wandb.proto import wandb_internal_pb2

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str) -> list[bytes]:
  data = open(path, "rb").read()
  assert data[:7] == HEADER, data[:7]
  out, pending, pos = [], b"", 7
  while pos + 7 <= len(data):
    if BLOCK - pos % BLOCK < 7:  # padding at a block's end
      pos += BLOCK - pos % BLOCK
      continue
    crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if length == 0 and kind == 0:  # zero padding
      pos += BLOCK - pos % BLOCK
      continue
    chunk = data[pos + 7:pos + 7 + length]
    assert crc == zlib.crc32(bytes([kind]) + chunk), f"{path}: chunk at byte {pos} fails its CRC-32"
    pending = chunk if kind in (FULL, FIRST) else pending + chunk
    if kind in (FULL, LAST):
      out.append(pending)
    pos += 7 + length
  return out


def _parsed(raw: bytes):
  record = wandb_internal_pb2.Record()
  record.ParseFromString(raw)
  return record


# How long a finished run's file may take to hold its last record: W&B's service writes it after `finish` returns
# (on a loaded machine a run's history was not yet in the file when the test read it). A hang detector.
WRITTEN_S = 120


def _complete(path: str) -> list[bytes]:
  """The records of a finished run's file, once its `exit` record is there."""
  deadline = time.monotonic() + WRITTEN_S
  while True:
    try:
      raw = records(path)
      if any(_parsed(r).WhichOneof("record_type") == "exit" for r in raw):
        return raw
    except AssertionError:  # a chunk still being written
      if time.monotonic() > deadline:
        raise
    assert time.monotonic() <= deadline, f"{path} holds no exit record after {WRITTEN_S} s"
    time.sleep(0.1)


def _records_of(workdir, kind: str) -> list:
  out = []
  for path in sorted(glob.glob(os.path.join(workdir, "wandb", "*run-*", "run-*.wandb"))):
    for raw in _complete(path):
      record = _parsed(raw)
      if record.WhichOneof("record_type") == kind:
        out.append(getattr(record, kind))
  return out


def history(workdir) -> list[dict]:
  """Every history row of every W&B run under <workdir>/wandb, in file then write order: {key: value}, `_step` too."""
  return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in h.item}
          for h in _records_of(workdir, "history")]


def runs(workdir) -> list[dict]:
  """Each W&B run's start record under <workdir>/wandb: {"id", "name", "project", "config": {key: value}}."""
  return [{"id": r.run_id, "name": r.display_name, "project": r.project,
           "config": {item.key: json.loads(item.value_json) for item in r.config.update}}
          for r in _records_of(workdir, "run")]

