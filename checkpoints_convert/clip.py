"""Hugging Face `CLIPModel` folder -> converted CLIP folder, through `checkpoints_convert`.

    python -m checkpoints_convert.clip --hf_dir clip-vit-large-patch14 --out_dir clip-l

A clean `model.safetensors` (or sharded index) is converted directly by the `clip` component of
`checkpoints_convert` (streaming, every key and parameter checked). Two released layouts need one
extra step first: checkpoints saved before transformers 4.31 hold the non-parameter
`{text,vision}_model.embeddings.position_ids` buffers, and some folders (PickScore_v1) may ship only
`pytorch_model.bin`. Those tensors are first streamed, one at a time and without the legacy
buffers, into a temporary safetensors file inside `out_dir` (deleted afterwards), which is then
converted as above. Tokenizer and preprocessor files are copied next to `params/`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Callable

import numpy as np

from checkpoints_convert import components, hf_to_flax, torch_files
from checkpoints_convert import safetensors_stream as st
from glmrl.checkpoint.params import PARAMS_DIR
from glmrl import errors
from glmrl.errors import UserError, run_command

# The name CLIP is registered under in `checkpoints_convert.components`.
COMPONENT = "clip"

LEGACY_BUFFERS = ("text_model.embeddings.position_ids", "vision_model.embeddings.position_ids")
TORCH_WEIGHTS = "pytorch_model.bin"


def _torch_source(path: str):
  """(specs, read) of a torch state_dict file, memory-mapped so tensors are read one at a time."""
  state = torch_files.load_torch(path)
  specs = [st.TensorSpec(k, tuple(v.shape), v.dtype) for k, v in state.items()
           if k not in LEGACY_BUFFERS]
  return specs, lambda key: state[key].numpy()


def _safetensors_source(reader: st.SafetensorsReader):
  specs = [st.TensorSpec(k, reader.info(k).shape, reader.info(k).dtype)
           for k in reader.keys() if k not in LEGACY_BUFFERS]
  return specs, reader.read


def convert_clip(hf_dir: str, out_dir: str, log: Callable[[str], None] = print) -> dict:
  """Converts one HF CLIP folder into `out_dir`/{params/, config.json, tokenizer files, ...}."""
  if not os.path.isdir(hf_dir):
    raise UserError(f"--hf_dir {hf_dir!r} is not a directory")
  component = components.get(COMPONENT)
  component.config_from_hf(component.read_config(hf_dir))  # a bad config fails before anything is read
  params_dir = os.path.join(out_dir, PARAMS_DIR)
  if os.path.exists(params_dir):
    raise UserError(f"{params_dir} already exists; remove it or choose another out_dir")
  try:
    reader = st.SafetensorsReader(st.find_weights(hf_dir, component.weights_name))
  except FileNotFoundError:
    reader = None
  if reader is not None and not any(k in reader for k in LEGACY_BUFFERS):
    result = hf_to_flax.convert_component(component, hf_dir, out_dir)
    log(f"converted {hf_dir}: {result['tensors']} tensors, {result['bytes'] / 1e9:.3f} GB -> {out_dir}")
    return result
  if reader is not None:
    specs, read = _safetensors_source(reader)
    log(f"{hf_dir}: dropping legacy buffers {[k for k in LEGACY_BUFFERS if k in reader]}")
  elif os.path.isfile(os.path.join(hf_dir, TORCH_WEIGHTS)):
    specs, read = _torch_source(os.path.join(hf_dir, TORCH_WEIGHTS))
    log(f"{hf_dir}: reading {TORCH_WEIGHTS}")
  else:
    raise FileNotFoundError(f"{hf_dir} has neither {component.weights_name} (or its index) nor {TORCH_WEIGHTS}")
  os.makedirs(out_dir, exist_ok=True)
  total = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in specs)
  with tempfile.TemporaryDirectory(prefix=".clip-clean-", dir=out_dir) as tmp:
    shutil.copy2(os.path.join(hf_dir, component.config_name), tmp)
    st.write_safetensors(tmp, component.weights_name, specs, read, max_shard_size=total + 1)
    plan, clean = hf_to_flax.plan_component(component, tmp)
    result = hf_to_flax.convert_component(component, hf_dir, out_dir, plan, clean)
  log(f"converted {hf_dir}: {result['tensors']} tensors, {result['bytes'] / 1e9:.3f} GB -> {out_dir}")
  return result


def main(argv=None) -> int:
  p = errors.ArgumentParser(prog="python -m checkpoints_convert.clip", description=__doc__.splitlines()[0])
  p.add_argument("--hf_dir", required=True, help="HF CLIPModel folder (config.json + weights + tokenizer)")
  p.add_argument("--out_dir", required=True, help="where config.json, params/ and the tokenizer are written")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  return run_command(lambda: convert_clip(args.hf_dir, args.out_dir))


if __name__ == "__main__":
  sys.exit(main())
