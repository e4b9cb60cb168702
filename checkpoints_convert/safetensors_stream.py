"""Tensor-at-a-time safetensors I/O (single-file or sharded checkpoints).

The format is an 8-byte little-endian header length, a JSON header mapping
each key to dtype / shape / byte range, then the raw bytes. Reading parses
headers only and copies one tensor when asked; writing plans every shard's
header up front and then streams tensors in, so neither direction ever holds
more than one tensor.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import struct
from typing import Callable, Iterable, Sequence

import ml_dtypes
import numpy as np
from glmrl.errors import UserError

# safetensors dtype names <-> numpy dtypes (ml_dtypes for those numpy lacks).
_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_HEADER_LIMIT = 100 * 2**20  # the safetensors library refuses larger headers
INDEX_SUFFIX = ".index.json"


def to_numpy_dtype(name: str) -> np.dtype:
  if name not in _DTYPES:
    raise UserError(f"unsupported safetensors dtype {name!r}")
  return _DTYPES[name]


def to_safetensors_dtype(dtype) -> str:
  dtype = np.dtype(dtype)
  if dtype not in _NAMES:
    raise ValueError(f"dtype {dtype} has no safetensors name")
  return _NAMES[dtype]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  key: str
  dtype: np.dtype
  shape: tuple[int, ...]
  file: str
  offset: int   # absolute byte offset of the data in `file`
  nbytes: int


def read_header(path: str) -> tuple[dict[str, TensorInfo], dict]:
  """({key: TensorInfo}, __metadata__) of one safetensors file."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise UserError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw)
    if n > _HEADER_LIMIT or 8 + n > size:
      raise UserError(f"{path}: header length {n} is invalid for a {size}-byte file")
    try:
      header = json.loads(f.read(n))
    except json.JSONDecodeError as e:
      raise UserError(f"{path}: header is not valid JSON ({e})") from e
  metadata = header.pop("__metadata__", None) or {}
  start, infos = 8 + n, {}
  for key, entry in header.items():
    dtype = to_numpy_dtype(entry["dtype"])
    shape = tuple(int(d) for d in entry["shape"])
    begin, end = (int(x) for x in entry["data_offsets"])
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes or start + end > size:
      raise UserError(f"{path}: tensor {key!r} has data_offsets [{begin}, {end}] "
                      f"inconsistent with {entry['dtype']}{list(shape)} in a {size}-byte file")
    infos[key] = TensorInfo(key, dtype, shape, path, start + begin, nbytes)
  return infos, metadata


def find_weights(directory: str, weights_name: str) -> str:
  """The index file or single file holding `weights_name` in `directory`."""
  index = os.path.join(directory, weights_name + INDEX_SUFFIX)
  single = os.path.join(directory, weights_name)
  if os.path.isfile(index):
    return index
  if os.path.isfile(single):
    return single
  raise FileNotFoundError(f"neither {single} nor {index} exists")


class SafetensorsReader:
  """Random access to the tensors of a single or sharded safetensors checkpoint.

  `path` is a `*.safetensors` file or a `*.safetensors.index.json` file.
  """

  def __init__(self, path: str):
    self.path = path
    self.metadata: dict = {}
    self._infos: dict[str, TensorInfo] = {}
    if path.endswith(INDEX_SUFFIX):
      self._read_index(path)
    else:
      self._infos, self.metadata = read_header(path)

  def _read_index(self, path):
    with open(path) as f:
      try:
        index = json.load(f)
      except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from e
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
      raise UserError(f"{path}: no 'weight_map' object")
    self.metadata = index.get("metadata") or {}
    root = os.path.dirname(path)
    by_file: dict[str, list[str]] = {}
    for key, fname in weight_map.items():
      by_file.setdefault(fname, []).append(key)
    for fname, keys in sorted(by_file.items()):
      shard = os.path.join(root, fname)
      if not os.path.isfile(shard):
        raise FileNotFoundError(f"{path} names shard {fname}, which does not exist")
      infos, _ = read_header(shard)
      listed = set(keys)
      if listed != set(infos):
        raise UserError(
            f"{shard}: holds {sorted(set(infos) - listed)} not listed in {path}, "
            f"lacks {sorted(listed - set(infos))} listed there")
      self._infos.update(infos)

  def keys(self) -> list[str]:
    return list(self._infos)

  def info(self, key: str) -> TensorInfo:
    return self._infos[key]

  def __contains__(self, key):
    return key in self._infos

  def __len__(self):
    return len(self._infos)

  def read(self, key: str) -> np.ndarray:
    """A fresh array holding tensor `key` (the only copy this makes)."""
    info = self._infos[key]
    out = np.empty(info.shape, info.dtype)
    if info.nbytes:
      with open(info.file, "rb", buffering=0) as f:
        f.seek(info.offset)
        view, done = memoryview(out.reshape(-1).view(np.uint8)), 0
        while done < info.nbytes:
          n = f.readinto(view[done:])
          if not n:
            raise UserError(f"{info.file}: truncated while reading {key!r}")
          done += n
    return out


def parse_size(size) -> int:
  """Bytes from an int or a string like '5GB' (10**9) / '5GiB' (2**30)."""
  if isinstance(size, int):
    value = size
  else:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(size), re.I)
    if not m:
      raise UserError(f"cannot parse size {size!r} (use e.g. 5GB, 500MiB, 1000000)")
    unit = (m.group(2) or "B").upper()
    base = 1024 if "I" in unit else 1000
    power = " KMGT".index(unit[0]) if unit != "B" else 0
    value = int(float(m.group(1)) * base**power)
  if value <= 0:
    raise UserError(f"size must be positive, got {size!r}")
  return value


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  key: str
  shape: tuple[int, ...]
  dtype: np.dtype


def plan_shards(specs: Sequence[TensorSpec], max_shard_size: int) -> list[list[TensorSpec]]:
  """Greedy split in the given order; a tensor larger than the limit gets its own shard."""
  shards: list[list[TensorSpec]] = [[]]
  size = 0
  for spec in specs:
    n = math.prod(spec.shape) * np.dtype(spec.dtype).itemsize
    if shards[-1] and size + n > max_shard_size:
      shards.append([])
      size = 0
    shards[-1].append(spec)
    size += n
  return shards


def _header_bytes(specs: Sequence[TensorSpec], metadata: dict) -> bytes:
  header, pos = {"__metadata__": metadata}, 0
  for spec in specs:
    n = math.prod(spec.shape) * np.dtype(spec.dtype).itemsize
    header[spec.key] = {"dtype": to_safetensors_dtype(spec.dtype),
                        "shape": list(spec.shape), "data_offsets": [pos, pos + n]}
    pos += n
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the library writes it
  return struct.pack("<Q", len(raw)) + raw


def write_safetensors(
    out_dir: str,
    weights_name: str,
    specs: Sequence[TensorSpec],
    read: Callable[[str], np.ndarray],
    *,
    max_shard_size: int,
    metadata: dict | None = None,
) -> list[str]:
  """Writes `specs` in order, calling `read(key)` for one tensor at a time.

  One file `weights_name` when everything fits in `max_shard_size`, otherwise
  `<stem>-0000i-of-0000n.safetensors` shards plus `<weights_name>.index.json`.
  Returns the written paths.
  """
  keys = [s.key for s in specs]
  if len(set(keys)) != len(keys):
    raise ValueError(f"duplicate keys: {sorted({k for k in keys if keys.count(k) > 1})}")
  metadata = {"format": "pt", **(metadata or {})}
  shards = plan_shards(specs, max_shard_size)
  stem = weights_name[:-len(".safetensors")] if weights_name.endswith(".safetensors") else weights_name
  if len(shards) == 1:
    names = [weights_name]
  else:
    names = [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  os.makedirs(out_dir, exist_ok=True)
  written = []
  for name, shard in zip(names, shards):
    path = os.path.join(out_dir, name)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
      f.write(_header_bytes(shard, metadata))
      for spec in shard:
        arr = np.asarray(read(spec.key))
        if not arr.flags.c_contiguous:  # (ascontiguousarray would turn 0-d into 1-d)
          arr = np.ascontiguousarray(arr)
        if arr.shape != tuple(spec.shape) or arr.dtype != np.dtype(spec.dtype):
          raise UserError(f"{spec.key}: read {arr.dtype}{list(arr.shape)}, "
                          f"planned {np.dtype(spec.dtype)}{list(spec.shape)}")
        if arr.size:
          f.write(memoryview(arr.reshape(-1).view(np.uint8)))
        del arr
    os.replace(tmp, path)
    written.append(path)
  if len(shards) > 1:
    total = sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize for s in specs)
    index = {"metadata": {"total_size": total},
             "weight_map": {s.key: n for n, shard in zip(names, shards) for s in shard}}
    path = os.path.join(out_dir, weights_name + INDEX_SUFFIX)
    with open(path, "w") as f:
      json.dump(index, f, indent=2, sort_keys=True)
      f.write("\n")
    written.append(path)
  return written


def natural_key(key: str) -> tuple:
  """Sort key that orders 'layers.2' before 'layers.10'."""
  return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", key) if t)


def sorted_naturally(keys: Iterable[str]) -> list[str]:
  return sorted(keys, key=natural_key)
