"""torch.save files read without torch (`checkpoints_convert.torch_pickle`), against torch itself: state dicts of
every dtype the released reward checkpoints hold and more, views into a shared storage (offset, strides),
parameters, nested dicts, in torch's zip layout and its legacy one, equal bit for bit; a pickle that would import
anything else is refused without running it; empty, text, truncated and foreign files are one line saying what they
are."""

import collections
import os
import pickle

import numpy as np
import pytest

from checkpoints_convert import torch_files, torch_pickle
from glmrl.errors import UserError

torch = pytest.importorskip("torch")

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)


def _state():
  g = torch.Generator().manual_seed(0)
  base = torch.randn(6, 5, generator=g)
  state = collections.OrderedDict()
  for dtype in DTYPES:
    state[f"t.{dtype}".replace("torch.", "")] = (torch.randn(3, 4, generator=g) * 50).to(dtype)
  state["view.column"] = base[:, 2]  # a view: offset 2, stride 5, sharing `base`'s storage
  state["view.transposed"] = base.t()
  state["view.base"] = base
  state["scalar"] = torch.tensor(3.5)
  state["empty"] = torch.zeros(0, 3)
  state["param"] = torch.nn.Parameter(torch.ones(2, 2))
  return {"state_dict": state, "epoch": 3, "name": "tiny"}


def _same(got, want):
  if isinstance(want, torch.Tensor):
    assert isinstance(got, torch_pickle.TorchTensor) and got.shape == tuple(want.shape)
    array = got.numpy()
    assert array.shape == got.shape and array.flags.c_contiguous
    want = want.detach()
    if want.dtype == torch.bfloat16:
      np.testing.assert_array_equal(array.view(np.int16), want.view(torch.int16).numpy())
    else:
      assert array.dtype == want.numpy().dtype
      np.testing.assert_array_equal(array, want.numpy())
  elif isinstance(want, dict):
    assert type(got) in (dict, collections.OrderedDict) and list(got) == list(want)
    for k in want:
      _same(got[k], want[k])
  else:
    assert got == want


@pytest.mark.parametrize("zip_layout", [True, False], ids=["zip", "legacy"])
def test_a_state_dict_reads_as_torch_reads_it(tmp_path, zip_layout):
  path = tmp_path / "w.pt"
  state = _state()
  torch.save(state, path, _use_new_zipfile_serialization=zip_layout)
  _same(torch_pickle.load(str(path)), state)
  # The converters' reader: float32 arrays of the file's tensors.
  torch.save(state["state_dict"], tmp_path / "flat.pt", _use_new_zipfile_serialization=zip_layout)
  read = torch_files.read_state_dict(str(tmp_path / "flat.pt"))
  for k, v in state["state_dict"].items():
    np.testing.assert_array_equal(read[k], v.detach().float().numpy())
    assert read[k].dtype == np.float32


class _Boom:
  def __reduce__(self):
    return (os.system, ("touch pwned",))


@pytest.mark.parametrize("zip_layout", [True, False], ids=["zip", "legacy"])
def test_a_pickle_that_would_run_code_is_refused_unrun(tmp_path, zip_layout, monkeypatch):
  monkeypatch.chdir(tmp_path)
  path = tmp_path / "evil.pt"
  torch.save({"w": torch.zeros(2), "x": _Boom()}, path, _use_new_zipfile_serialization=zip_layout)
  with pytest.raises(UserError, match=r"not a torch checkpoint: refused (posix|os)\.system: a state dict of tensors "
                     r"holds none"):
    torch_files.load_torch(str(path))
  assert not (tmp_path / "pwned").exists()


def test_files_that_are_not_checkpoints_say_what_they_are(tmp_path):
  torch.save({"w": torch.arange(1000.0)}, tmp_path / "good.pt")
  torch.save({"w": torch.arange(1000.0)}, tmp_path / "good_legacy.pt", _use_new_zipfile_serialization=False)
  cases = {
      "empty.pt": (b"", "empty (0 bytes)"),
      "text.pt": (b"<html>404 Not Found</html>\n", "text"),
      "binary.pt": (bytes(range(1, 200)), "neither a zip archive nor a pickle"),
      "plain.pt": (pickle.dumps({"a": 1}), "not one torch.save wrote"),
      "cut.pt": ((tmp_path / "good.pt").read_bytes()[:2000], "a damaged zip archive"),
      "cut_legacy.pt": ((tmp_path / "good_legacy.pt").read_bytes()[:-100], "truncated"),
  }
  for name, (content, message) in cases.items():
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError) as e:
      torch_files.load_torch(str(tmp_path / name))
      torch_files.read_state_dict(str(tmp_path / name))
    line, prefix = str(e.value), f"{tmp_path / name}: not a torch checkpoint: "
    assert line.startswith(prefix) and message in line[len(prefix):] and "\n" not in line, (name, line)
