"""torch's `torch.save` files read without torch: the state dicts the released reward checkpoints are (HPS v2.1,
ImageReward, the LAION aesthetic head), as numpy arrays.

Both of torch's layouts: the zip archive of torch >= 1.6 (`<name>/data.pkl`, a pickle whose tensors point by
persistent id at the raw storages `<name>/data/<key>`, stored uncompressed) and the legacy stream of
`_use_new_zipfile_serialization=False` (five pickles in a row, magic number, protocol, system info, the object, the
storages' keys, then each storage as its element count and bytes). The unpickler builds only what a state dict holds:
ordered dicts, tensors (`torch._utils._rebuild_tensor_v2`, parameters) on the storages of the dtypes below, and the
plain containers and numbers pickle makes by itself; any other class or function is refused, never imported or called
(a pickle can otherwise run any code).

A tensor is read when asked for (`TorchTensor.numpy`), each storage once: a converter holds one model's tensors at a
time, as torch's `mmap=True` would.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import pickle
import struct
import zipfile

import ml_dtypes
import numpy as np

from glmrl.errors import UserError

# torch's storage classes as pickled (`torch.<name>`), by the dtype of their elements.
STORAGE_DTYPES = {
    "FloatStorage": np.dtype(np.float32), "DoubleStorage": np.dtype(np.float64), "HalfStorage": np.dtype(np.float16),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16), "LongStorage": np.dtype(np.int64),
    "IntStorage": np.dtype(np.int32), "ShortStorage": np.dtype(np.int16), "CharStorage": np.dtype(np.int8),
    "ByteStorage": np.dtype(np.uint8), "BoolStorage": np.dtype(np.bool_),
}
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
ZIP_MAGIC = b"PK\x03\x04"


class NotTorchFile(UserError):
  """The file is not a torch.save file this module reads: one line, "PATH: not a torch checkpoint: what it is"."""

  def __init__(self, path: str, why: str):
    super().__init__(f"{path}: not a torch checkpoint: {why}")


class _Damaged(Exception):
  """What is wrong inside a file (`load` and `TorchTensor.numpy` name the file)."""


@dataclasses.dataclass(frozen=True)
class _StorageType:
  dtype: np.dtype


class _Storage:
  """One storage: its dtype and how to read its bytes (once)."""

  def __init__(self, path: str, dtype: np.dtype, numel: int, read):
    self.path, self.dtype, self.numel, self._read, self._array = path, dtype, numel, read, None

  def array(self) -> np.ndarray:
    if self._array is None:
      try:
        raw = self._read()
      except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise NotTorchFile(self.path, f"a storage could not be read ({e}; truncated?)") from None
      if len(raw) != self.numel * self.dtype.itemsize:
        raise NotTorchFile(self.path, f"a storage holds {len(raw)} bytes where its {self.numel} elements of "
                           f"{self.dtype} take {self.numel * self.dtype.itemsize} (truncated?)")
      self._array = np.frombuffer(raw, self.dtype)
    return self._array


@dataclasses.dataclass(frozen=True)
class TorchTensor:
  """A tensor of the file, not read yet: `shape`, `dtype`, and `numpy()` its values (a new contiguous array)."""
  storage: _Storage
  offset: int
  shape: tuple[int, ...]
  stride: tuple[int, ...]

  @property
  def dtype(self) -> np.dtype:
    return self.storage.dtype

  def numpy(self) -> np.ndarray:
    flat = self.storage.array()
    size = int(np.prod(self.shape, dtype=np.int64))
    if size == 0:
      return np.zeros(self.shape, self.dtype)
    last = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride))
    if self.offset < 0 or last >= flat.size:
      raise NotTorchFile(self.storage.path, f"a tensor of shape {list(self.shape)} reaches past its storage of "
                         f"{flat.size} elements")
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(flat[self.offset:], self.shape, tuple(s * item for s in self.stride),
                                           writeable=False)
    return view.copy()  # C-contiguous, and 0-d stays 0-d (ascontiguousarray would make it 1-d)


def _rebuild_tensor(storage, storage_offset, size, stride, *unused):
  del unused  # requires_grad, backward hooks, metadata: nothing a state dict's values need
  if not isinstance(storage, _Storage):
    raise pickle.UnpicklingError("a tensor whose storage is not one of the file's")
  return TorchTensor(storage, int(storage_offset), tuple(int(n) for n in size), tuple(int(s) for s in stride))


def _rebuild_parameter(data, requires_grad, backward_hooks, *unused):
  del requires_grad, backward_hooks, unused
  return data


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(dtype) for name, dtype in STORAGE_DTYPES.items()},
}


class _Unpickler(pickle.Unpickler):
  def __init__(self, file, storage):
    super().__init__(file)
    self._storage = storage  # (storage type, key, numel) -> _Storage

  def find_class(self, module, name):
    if (module, name) not in _ALLOWED:
      raise pickle.UnpicklingError(f"refused {module}.{name}: a state dict of tensors holds none (its pickle would "
                                   "import and run it)")
    return _ALLOWED[(module, name)]

  def persistent_load(self, pid):
    if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
      raise pickle.UnpicklingError(f"unknown persistent id {str(pid)[:80]}")
    return self._storage(pid[1], str(pid[2]), int(pid[4]))


def _zip(path: str) -> dict:
  archive = zipfile.ZipFile(path)
  names = archive.namelist()
  pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
  if len(pickles) != 1:
    raise _Damaged("a zip archive without torch's <name>/data.pkl")
  root = pickles[0].split("/")[0]
  if f"{root}/byteorder" in names and archive.read(f"{root}/byteorder").strip() != b"little":
    raise _Damaged("written big-endian, which is not read here")
  storages = {}

  def storage(kind, key, numel):
    if key not in storages:
      member = f"{root}/data/{key}"
      if member not in names:
        raise _Damaged(f"its pickle names storage {key}, which the archive lacks (truncated?)")
      storages[key] = _Storage(path, kind.dtype, numel, lambda m=member: archive.read(m))
    return storages[key]

  return _Unpickler(io.BytesIO(archive.read(pickles[0])), storage).load()


def _legacy(path: str, f) -> dict:
  plain = lambda: _Unpickler(f, lambda *a: None).load()  # the header's pickles hold plain values only
  if plain() != LEGACY_MAGIC:
    raise _Damaged("a pickle, but not one torch.save wrote (no torch magic number)")
  plain()  # protocol version
  sys_info = plain()
  if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
    raise _Damaged("written big-endian, which is not read here")
  storages = {}

  def storage(kind, key, numel):
    if key not in storages:
      storages[key] = _Storage(path, kind.dtype, numel, lambda: b"")  # its bytes follow the object's pickle
    return storages[key]

  obj = _Unpickler(f, storage).load()
  keys = plain()
  if not isinstance(keys, list):
    raise _Damaged("no list of storages after its object")
  for key in keys:
    s = storages.get(str(key))
    if s is None:
      raise _Damaged(f"its storage list names {key}, which no tensor uses")
    head = f.read(8)
    if len(head) != 8:
      raise _Damaged("ends before its storages' bytes (truncated?)")
    (numel,) = struct.unpack("<q", head)
    raw = f.read(numel * s.dtype.itemsize)
    if len(raw) != numel * s.dtype.itemsize:
      raise _Damaged(f"ends inside storage {key} (truncated?)")
    s.numel, s._read = numel, (lambda r=raw: r)  # pylint: disable=protected-access
  return obj


def load(path: str):
  """The object a torch.save file holds, its tensors as `TorchTensor`s; NotTorchFile (one line) when the file is
  not one, or a damaged one."""
  with open(path, "rb") as f:
    head = f.read(8)
  if not head:
    raise NotTorchFile(path, "empty (0 bytes)")
  try:
    if head.startswith(ZIP_MAGIC):
      return _zip(path)
    if head[:1] != b"\x80":
      text = all(32 <= b < 127 or b in (9, 10, 13) for b in head)
      raise _Damaged("text" if text else "neither a zip archive nor a pickle")
    with open(path, "rb") as f:
      return _legacy(path, f)
  except zipfile.BadZipFile as e:
    raise NotTorchFile(path, f"a damaged zip archive ({e}; truncated?)") from None
  except EOFError:
    raise NotTorchFile(path, "a pickle that ends early (truncated?)") from None
  except (_Damaged, pickle.UnpicklingError) as e:
    raise NotTorchFile(path, str(e)) from None
  except (ValueError, TypeError, IndexError, KeyError, AttributeError) as e:  # pickle's own on a damaged stream
    raise NotTorchFile(path, f"a damaged pickle ({type(e).__name__}: {e})") from None
