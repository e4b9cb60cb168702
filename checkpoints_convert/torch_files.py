"""Reading a published weight file (torch state_dict pickle or safetensors) into one dict of arrays."""

import os

import numpy as np

from checkpoints_convert import safetensors_stream as st
from checkpoints_convert import torch_pickle
from glmrl.errors import UserError

_TORCH_SUFFIXES = (".pth", ".pt", ".bin")


def load_torch(path: str) -> dict:
  """The dict a torch pickle holds, its tensors read when used, one storage at a time (`torch_pickle`: no torch
  needed)."""
  state = torch_pickle.load(path)
  if not isinstance(state, dict):
    raise UserError(f"{path}: holds a {type(state).__name__}, not a state_dict")
  return state


def read_state_dict(path: str, keep=lambda key: True) -> dict[str, np.ndarray]:
  """{key: float32 array} of the tensors of `path` whose key passes `keep`."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no weights file {path}")
  if path.endswith(".safetensors"):
    reader = st.SafetensorsReader(path)
    return {k: reader.read(k).astype(np.float32) for k in reader.keys() if keep(k)}
  if not path.endswith(_TORCH_SUFFIXES):
    raise UserError(f"{path}: expected a .safetensors or torch pickle ({', '.join(_TORCH_SUFFIXES)}) file")
  return {k: v.numpy().astype(np.float32) for k, v in load_torch(path).items() if keep(k)}
