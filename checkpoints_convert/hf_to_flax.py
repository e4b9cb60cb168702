"""HF safetensors folders -> Orbax parameter checkpoints.

Conversion never holds the model: every parameter is handed to Orbax as a
lazy leaf that reads (and transposes) its one tensor when Orbax writes it, and
a private type handler writes those leaves one after another. The leaves are
recorded as plain numpy arrays, so the result is an ordinary Orbax checkpoint
that `glmrl.checkpoint.params.restore_params` (or any Orbax restore) reads onto a mesh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import os
import shutil
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from checkpoints_convert import components as components_lib
from checkpoints_convert import rules as rules_lib
from checkpoints_convert import safetensors_stream as st
from glmrl.checkpoint.params import CONFIG_NAME, PARAMS_DIR, check_coverage, flatten, nest
from glmrl.errors import UserError

# Orbax stores each array in chunks of at most this many bytes, so a sharded
# restore reads only the chunks a device needs.
CHUNK_BYTES = 64 * 2**20
# zstd would keep a compressed copy of each tensor buffered until its write
# commits (+~1 tensor of peak memory, measured) and gains little on bf16
# weights, so converted checkpoints are stored uncompressed.
USE_COMPRESSION = False


def expected_params(component: components_lib.Component, cfg) -> dict[str, jax.ShapeDtypeStruct]:
  """{flax path: ShapeDtypeStruct} of the model's nnx.Param leaves."""
  return flatten(nnx.state(component.build_abstract(cfg), nnx.Param))


# ---------------------------------------------------------------------------
# HF -> Flax planning (headers only, before anything is read or written).

@dataclasses.dataclass(frozen=True)
class Planned:
  hf_key: str
  flax_path: str
  transform: Any
  hf: st.TensorInfo
  flax_shape: tuple[int, ...]

  def load(self, reader: st.SafetensorsReader) -> np.ndarray:
    return self.transform.to_flax(reader.read(self.hf_key))


def plan_component(component: components_lib.Component, src_dir: str, cfg=None):
  """(plan, reader) for one HF component folder; raises on any key or shape problem."""
  if cfg is None:
    cfg = component.config_from_hf(component.read_config(src_dir))
  weights = st.find_weights(src_dir, component.weights_name)
  reader = st.SafetensorsReader(weights)
  key_map = component.key_map()
  expected = expected_params(component, cfg)
  plan, produced, unexpected, mismatched = {}, {}, [], []
  for key in reader.keys():
    info = reader.info(key)
    match = key_map.hf_to_flax(key)
    if match is None:
      unexpected.append(key)
      continue
    path, transform = match
    if path not in expected:
      unexpected.append(f"{key} (-> {path}, not a parameter of the model)")
      continue
    want = tuple(expected[path].shape)
    try:
      got = tuple(transform.flax_shape(info.shape))
    except ValueError as e:
      got = f"({e})"
    if got != want:
      mismatched.append(f"{key} {list(info.shape)} -> {path} gives {got}, model expects {want}")
      continue
    if path in produced:  # tied weights stored under several names: one param, checked equal now
      first = reader.info(produced[path])
      if info.dtype != first.dtype:
        mismatched.append(f"{key} is {info.dtype}, {produced[path]} (same param {path}) is {first.dtype}")
      elif transform.to_flax(reader.read(key)).tobytes() != plan[path].load(reader).tobytes():
        mismatched.append(f"{key} and {produced[path]} both map to {path} but differ")
      continue
    produced[path] = key
    plan[path] = Planned(key, path, transform, info, want)
  missing = []
  for path in expected:
    if path not in produced:
      back = key_map.flax_to_hf(path)
      missing.append(f"{back[0] if back else '(no rule)'} (for {path})")
  check_coverage(f"{component.name}: {weights}", missing, unexpected, mismatched)
  return list(plan.values()), reader


def plan_state_dict(state: dict[str, np.ndarray], key_map: rules_lib.KeyMap, expected: dict, where: str
                    ) -> dict[str, np.ndarray]:
  """{flax path: array} of an in-memory state_dict (small published files: LPIPS, the aesthetic head),
  checked like `plan_component`: one ValueError lists every unexpected, missing and mis-shaped key."""
  out, unexpected, mismatched = {}, [], []
  for key, value in state.items():
    match = key_map.hf_to_flax(key)
    if match is None or match[0] not in expected:
      unexpected.append(key)
      continue
    path, transform = match
    want = tuple(expected[path].shape)
    try:
      got = transform.flax_shape(value.shape)
    except ValueError as e:
      got = f"({e})"
    if got != want:
      mismatched.append(f"{key} {list(value.shape)} -> {path} gives {got}, model expects {want}")
      continue
    out[path] = transform.to_flax(value)
  missing = [f"{key_map.flax_to_hf(p)[0]} (for {p})" for p in expected if p not in out]
  check_coverage(where, missing, unexpected, mismatched)
  return out


# ---------------------------------------------------------------------------
# Sequential, lazily materialised Orbax save.

class LazyArray:
  """A leaf Orbax writes by calling `load()`; only shape and dtype exist before."""

  def __init__(self, shape, dtype, load: Callable[[], np.ndarray]):
    self.shape, self.dtype, self.load = tuple(shape), np.dtype(dtype), load

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def nbytes(self) -> int:
    return self.size * self.dtype.itemsize


class _SequentialNumpyHandler(ocp.type_handlers.NumpyHandler):
  """Writes LazyArray leaves one at a time, recorded as 'np.ndarray'.

  Orbax hands a handler all of its leaves in one batch; materialising and
  awaiting them one by one bounds memory by the largest tensor. Relies on
  NumpyHandler._background_serialize (orbax-checkpoint pinned in requirements).
  """

  def __init__(self):
    super().__init__(deepcopy_host_arrays=False)

  async def _background_serialize(self, values, infos, args=None):
    args = args or [ocp.SaveArgs()] * len(values)
    for value, info, arg in zip(values, infos, args):
      arr = await asyncio.to_thread(value.load) if isinstance(value, LazyArray) else value
      if arr.shape != value.shape or arr.dtype != value.dtype:
        raise UserError(f"{info.name}: loaded {arr.dtype}{list(arr.shape)}, "
                        f"declared {value.dtype}{list(value.shape)}")
      await super()._background_serialize([arr], [info], [arg])
      del arr


def save_params(params_dir: str, flat: dict[str, LazyArray | np.ndarray]):
  """Writes {flax path: leaf} as one Orbax PyTree checkpoint at `params_dir`."""
  if os.path.exists(params_dir):
    raise UserError(f"{params_dir} already exists; remove it or choose another out_dir")
  leaf_handler = _SequentialNumpyHandler()
  registry = ocp.type_handlers.create_type_handler_registry(
      (LazyArray, leaf_handler), (np.ndarray, leaf_handler),
      (jax.Array, ocp.type_handlers.get_type_handler(jax.Array)))
  tree = nest(flat)
  save_args = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES), tree)
  handler = ocp.PyTreeCheckpointHandler(type_handler_registry=registry, use_compression=USE_COMPRESSION)
  with ocp.Checkpointer(handler) as ckptr:
    ckptr.save(os.path.abspath(params_dir), args=ocp.args.PyTreeSave(tree, save_args=save_args))


# ---------------------------------------------------------------------------
# Whole folders.

def write_model_folder(out_dir: str, config_dict: dict, flat: dict[str, np.ndarray]) -> dict:
  """`out_dir`/{config.json, params/} of a small model held in memory; returns a summary."""
  params_dir = os.path.join(out_dir, PARAMS_DIR)
  if os.path.exists(params_dir):
    raise UserError(f"{params_dir} already exists; remove it or choose another out_dir")
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, CONFIG_NAME), "w") as f:
    json.dump(config_dict, f, indent=2)
  save_params(params_dir, flat)
  return {"tensors": len(flat), "bytes": sum(a.nbytes for a in flat.values()), "config": config_dict}




def copy_component_files(src_dir: str, dst_dir: str, skip=()):
  """Copies the non-weight files of a component folder verbatim."""
  os.makedirs(dst_dir, exist_ok=True)
  for name in sorted(os.listdir(src_dir)):
    path = os.path.join(src_dir, name)
    if name in skip or not os.path.isfile(path) or components_lib.is_weights_file(name):
      continue
    shutil.copy2(path, os.path.join(dst_dir, name))


def convert_component(component, src_dir: str, dst_dir: str, plan=None, reader=None) -> dict:
  """Converts one HF component folder into `dst_dir`/{params/, config.json, ...}."""
  if plan is None:
    plan, reader = plan_component(component, src_dir)
  leaves = {
      p.flax_path: LazyArray(p.flax_shape, p.hf.dtype, functools.partial(p.load, reader))
      for p in plan}
  copy_component_files(src_dir, dst_dir)
  save_params(os.path.join(dst_dir, PARAMS_DIR), leaves)
  return {"tensors": len(plan), "bytes": sum(p.hf.nbytes for p in plan),
          "largest": max((p.hf.nbytes for p in plan), default=0)}


def _check_model_index(hf_dir: str, names):
  path = os.path.join(hf_dir, components_lib.MODEL_INDEX)
  if not os.path.isfile(path):
    return
  with open(path) as f:
    index = json.load(f)
  for name in names:
    listed = index.get(name)
    want = list(components_lib.get(name).library)
    if listed is not None and list(listed) != want:
      raise UserError(f"{path}: {name} is {listed}, the converter handles {want}")


def convert_pipeline(hf_dir: str, out_dir: str, log: Callable[[str], None] = print) -> dict:
  """Converts every component present in `hf_dir`; returns {'converted', 'skipped', 'copied'}.

  All present components are validated (configs, keys, shapes) before any
  tensor is read or written.
  """
  if not os.path.isdir(hf_dir):
    raise UserError(f"--hf_dir {hf_dir!r} is not a directory")
  present = [n for n in components_lib.COMPONENTS if os.path.isdir(os.path.join(hf_dir, n))]
  skipped = [n for n in components_lib.COMPONENTS if n not in present]
  if not present:
    raise UserError(f"{hf_dir} holds none of the components {sorted(components_lib.COMPONENTS)}")
  _check_model_index(hf_dir, present)
  plans = {n: plan_component(components_lib.get(n), os.path.join(hf_dir, n)) for n in present}
  for n in present:
    if os.path.exists(os.path.join(out_dir, n, PARAMS_DIR)):
      raise UserError(f"{os.path.join(out_dir, n, PARAMS_DIR)} already exists")
  for n in skipped:
    log(f"skipped {n}: not in {hf_dir}")
  converted = {}
  for n in present:
    plan, reader = plans[n]
    converted[n] = convert_component(components_lib.get(n), os.path.join(hf_dir, n),
                                     os.path.join(out_dir, n), plan, reader)
    log(f"converted {n}: {converted[n]['tensors']} tensors, {converted[n]['bytes'] / 1e9:.3f} GB")
  copied = copy_pipeline_files(hf_dir, out_dir, log)
  return {"converted": converted, "skipped": skipped, "copied": copied}


def copy_pipeline_files(src: str, dst: str, log) -> list[str]:
  copied = []
  os.makedirs(dst, exist_ok=True)
  for name in components_lib.COPIED_FOLDERS:
    path = os.path.join(src, name)
    if os.path.isdir(path):
      shutil.copytree(path, os.path.join(dst, name), dirs_exist_ok=True)
      copied.append(name)
    else:
      log(f"skipped {name}/: not in {src}")
  if os.path.isfile(os.path.join(src, components_lib.MODEL_INDEX)):
    shutil.copy2(os.path.join(src, components_lib.MODEL_INDEX), dst)
    copied.append(components_lib.MODEL_INDEX)
  return copied
