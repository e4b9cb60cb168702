"""Reading a published weight file (torch state_dict pickle or safetensors) into one dict of arrays."""

import os

import numpy as np

from checkpoints_convert import safetensors_stream as st
from glmrl.errors import UserError

_TORCH_SUFFIXES = (".pth", ".pt", ".bin")


def to_numpy(tensor) -> np.ndarray:
  """A torch tensor's values as numpy, in its own dtype (bfloat16 through ml_dtypes, bit for bit)."""
  import ml_dtypes
  import torch

  tensor = tensor.detach().cpu().contiguous()
  if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
    return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return tensor.numpy()


def numpy_dtype(tensor) -> np.dtype:
  """The numpy dtype `to_numpy` gives `tensor`, without reading its values."""
  return to_numpy(tensor.new_empty(0)).dtype


def load_torch(path: str, *, mmap: bool = False) -> dict:
  """The dict a torch pickle holds (weights only; with `mmap` its tensors are read from disk when used)."""
  try:
    import torch
  except ImportError as e:
    raise UserError(f"{path}: reading torch pickles needs torch; convert the file to safetensors "
                    "or install torch") from e
  try:
    state = torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
  except Exception as e:  # torch raises several types for corrupt or non-checkpoint files
    raise UserError(f"{path}: could not be read as a torch checkpoint ({type(e).__name__}: {e})") from e
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
  return {k: v.detach().float().numpy() for k, v in load_torch(path).items() if keep(k)}
