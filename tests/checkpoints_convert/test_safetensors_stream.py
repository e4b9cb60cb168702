"""Streaming safetensors reader/writer against the safetensors library."""

import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors.torch
import torch

from checkpoints_convert import safetensors_stream as st

_DTYPES = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16, torch.float32: np.float32,
           torch.int64: np.int64, torch.uint8: np.uint8, torch.bool: np.bool_}


def _torch_tensors():
  torch.manual_seed(0)
  return {
      "a.weight": torch.randn(7, 5, dtype=torch.bfloat16),
      "a.bias": torch.randn(5, dtype=torch.float16),
      "b.layers.10.w": torch.randn(3, 2, 2),
      "b.layers.2.w": torch.randn(3, 2, 2),
      "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
      "mask": torch.tensor([True, False, True]),
      "scalar": torch.tensor(1.5),
      "empty": torch.zeros(0, 4),
  }


def _as_numpy(t: torch.Tensor) -> np.ndarray:
  """Bit copy of a torch tensor as numpy (bf16 through its uint16 view)."""
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return t.numpy()


def test_reads_library_written_file_bit_exact(tmp_path):
  tensors = _torch_tensors()
  path = str(tmp_path / "model.safetensors")
  safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
  reader = st.SafetensorsReader(path)
  assert set(reader.keys()) == set(tensors)
  assert reader.metadata == {"format": "pt"}
  for key, t in tensors.items():
    got = reader.read(key)
    assert got.dtype == np.dtype(_DTYPES[t.dtype]) and got.shape == tuple(t.shape), key
    assert got.tobytes() == _as_numpy(t).tobytes(), key


@pytest.mark.parametrize("max_shard_size", [10**9, 64])
def test_written_files_load_in_library_bit_exact(tmp_path, max_shard_size):
  tensors = {k: _as_numpy(t) for k, t in _torch_tensors().items()}
  specs = [st.TensorSpec(k, v.shape, v.dtype) for k, v in tensors.items()]
  reads = []
  files = st.write_safetensors(str(tmp_path), "model.safetensors", specs,
                               lambda k: reads.append(k) or tensors[k], max_shard_size=max_shard_size)
  assert reads == list(tensors)  # each tensor read once, in order
  names = sorted(os.path.basename(f) for f in files)
  if max_shard_size == 64:
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert names == sorted(shards + ["model.safetensors.index.json"])
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors" and len(shards) > 2
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in tensors.values())
  else:
    assert names == ["model.safetensors"]
    shards = names
  loaded = {}
  for shard in shards:
    loaded.update(safetensors.torch.load_file(str(tmp_path / shard)))
  assert set(loaded) == set(tensors)
  for key, t in loaded.items():
    assert _as_numpy(t).tobytes() == tensors[key].tobytes() and tuple(t.shape) == tensors[key].shape, key
    assert np.dtype(_DTYPES[t.dtype]) == tensors[key].dtype, key
  reread = st.SafetensorsReader(st.find_weights(str(tmp_path), "model.safetensors"))
  for key, v in tensors.items():
    assert reread.read(key).tobytes() == v.tobytes()


def test_plan_shards_greedy_in_order():
  specs = [st.TensorSpec(f"t{i}", (n,), np.uint8) for i, n in enumerate([4, 4, 9, 1, 1, 3])]
  plan = st.plan_shards(specs, 8)
  assert [[s.key for s in shard] for shard in plan] == [["t0", "t1"], ["t2"], ["t3", "t4", "t5"]]


def test_parse_size():
  assert st.parse_size("5GB") == 5 * 10**9
  assert st.parse_size("500MiB") == 500 * 2**20
  assert st.parse_size(1234) == 1234
  with pytest.raises(ValueError, match="5 parsecs"):
    st.parse_size("5 parsecs")
  with pytest.raises(ValueError, match="positive"):
    st.parse_size(0)


def test_natural_order():
  assert st.sorted_naturally(["l.10.w", "l.2.w", "l.1.b", "emb"]) == ["emb", "l.1.b", "l.2.w", "l.10.w"]


def test_corrupt_files_name_the_file(tmp_path):
  bad = tmp_path / "bad.safetensors"
  bad.write_bytes(struct.pack("<Q", 10**6) + b"{}")
  with pytest.raises(ValueError, match="bad.safetensors"):
    st.SafetensorsReader(str(bad))
  short = tmp_path / "short.safetensors"
  header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
  short.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
  with pytest.raises(ValueError, match="short.safetensors.*'w'"):
    st.SafetensorsReader(str(short))
  index = tmp_path / "m.safetensors.index.json"
  index.write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
  with pytest.raises(FileNotFoundError, match="gone.safetensors"):
    st.SafetensorsReader(str(index))
  with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
    st.find_weights(str(tmp_path), "nothing.safetensors")


def test_index_must_match_shard_contents(tmp_path):
  safetensors.torch.save_file({"a": torch.zeros(2), "b": torch.ones(2)}, str(tmp_path / "s1.safetensors"))
  index = tmp_path / "m.safetensors.index.json"
  index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors"}}))
  with pytest.raises(ValueError, match=r"s1.safetensors: holds \['b'\]"):
    st.SafetensorsReader(str(index))
