"""HF safetensors folders -> Orbax parameter checkpoints, and loading them back.

Conversion never holds the model: every parameter is handed to Orbax as a
lazy leaf that reads (and transposes) its one tensor when Orbax writes it, and
a private type handler writes those leaves one after another. The leaves are
recorded as plain numpy arrays, so the result is an ordinary Orbax checkpoint
that `load_params` (or any Orbax restore) reads onto a mesh.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import math
import os
import shutil
from typing import Any, Callable

import glmrl  # noqa: F401
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from checkpoints_convert import components as components_lib
from checkpoints_convert import rules as rules_lib
from checkpoints_convert import safetensors_stream as st

# Orbax stores each array in chunks of at most this many bytes, so a sharded
# restore reads only the chunks a device needs.
CHUNK_BYTES = 64 * 2**20
# zstd would keep a compressed copy of each tensor buffered until its write
# commits (+~1 tensor of peak memory, measured) and gains little on bf16
# weights, so converted checkpoints are stored uncompressed.
USE_COMPRESSION = False


# ---------------------------------------------------------------------------
# Flat views of parameter trees.

def flatten(tree) -> dict[str, Any]:
  """{'a.layers.0.kernel': leaf} of an nnx.State or a nested dict."""
  if isinstance(tree, nnx.State):
    tree = nnx.to_pure_dict(tree)
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
  return {rules_lib.flax_path_str(path): leaf for path, leaf in leaves}


def nest(flat: dict[str, Any]) -> dict:
  """Inverse of `flatten` for dicts; integer segments become int keys (like nnx.to_pure_dict)."""
  out: dict = {}
  for path, leaf in flat.items():
    node = out
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = leaf
  return out


def expected_params(component: components_lib.Component, cfg) -> dict[str, jax.ShapeDtypeStruct]:
  """{flax path: ShapeDtypeStruct} of the model's nnx.Param leaves."""
  return flatten(nnx.state(component.build_abstract(cfg), nnx.Param))


def check_coverage(where: str, missing=(), unexpected=(), mismatched=()):
  """One ValueError listing every missing / unexpected / mis-shaped key."""
  lines = []
  if missing:
    lines.append(f"missing ({len(missing)}): " + ", ".join(missing))
  if unexpected:
    lines.append(f"unexpected ({len(unexpected)}): " + ", ".join(unexpected))
  if mismatched:
    lines.append(f"shape mismatch ({len(mismatched)}): " + "; ".join(mismatched))
  if lines:
    raise ValueError(f"{where}:\n  " + "\n  ".join(lines))


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
        raise ValueError(f"{info.name}: loaded {arr.dtype}{list(arr.shape)}, "
                         f"declared {value.dtype}{list(value.shape)}")
      await super()._background_serialize([arr], [info], [arg])
      del arr


def save_params(params_dir: str, flat: dict[str, LazyArray | np.ndarray]):
  """Writes {flax path: leaf} as one Orbax PyTree checkpoint at `params_dir`."""
  if os.path.exists(params_dir):
    raise ValueError(f"{params_dir} already exists; remove it or choose another out_dir")
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
  save_params(os.path.join(dst_dir, components_lib.PARAMS_DIR), leaves)
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
      raise ValueError(f"{path}: {name} is {listed}, the converter handles {want}")


def convert(hf_dir: str, out_dir: str, log: Callable[[str], None] = print) -> dict:
  """Converts every component present in `hf_dir`; returns {'converted', 'skipped', 'copied'}.

  All present components are validated (configs, keys, shapes) before any
  tensor is read or written.
  """
  if not os.path.isdir(hf_dir):
    raise ValueError(f"--hf_dir {hf_dir!r} is not a directory")
  present = [n for n in components_lib.COMPONENTS if os.path.isdir(os.path.join(hf_dir, n))]
  skipped = [n for n in components_lib.COMPONENTS if n not in present]
  if not present:
    raise ValueError(f"{hf_dir} holds none of the components {sorted(components_lib.COMPONENTS)}")
  _check_model_index(hf_dir, present)
  plans = {n: plan_component(components_lib.get(n), os.path.join(hf_dir, n)) for n in present}
  for n in present:
    if os.path.exists(os.path.join(out_dir, n, components_lib.PARAMS_DIR)):
      raise ValueError(f"{os.path.join(out_dir, n, components_lib.PARAMS_DIR)} already exists")
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


# ---------------------------------------------------------------------------
# Reading Orbax parameter checkpoints.

def params_dir_of(directory: str) -> str:
  """`directory`/params if present, else `directory` itself when it is an Orbax checkpoint."""
  sub = os.path.join(directory, components_lib.PARAMS_DIR)
  for d in (sub, directory):
    if os.path.isfile(os.path.join(d, "_METADATA")):
      return d
  raise FileNotFoundError(f"no Orbax parameter checkpoint at {sub} or {directory}")


@dataclasses.dataclass(frozen=True)
class StoredLeaf:
  keys: tuple[str, ...]   # the checkpoint's own tree keys
  shape: tuple[int, ...]
  dtype: np.dtype


def stored_leaves(params_dir: str) -> dict[str, StoredLeaf]:
  """{flax path: StoredLeaf} of a checkpoint, from its metadata only.

  A trailing '.value' (what saving an nnx.State directly produces) is dropped
  so both pure-dict and State checkpoints give the model's param paths.
  """
  meta = ocp.PyTreeCheckpointHandler().metadata(epath.Path(os.path.abspath(params_dir)))
  tree = meta.tree if hasattr(meta, "tree") else meta
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = tuple(str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))) for p in path)
    name = ".".join(keys[:-1] if keys[-1] == "value" and len(keys) > 1 else keys)
    if name in out:
      raise ValueError(f"{params_dir}: two leaves map to {name}")
    out[name] = StoredLeaf(keys, tuple(leaf.shape), np.dtype(leaf.dtype))
  return out


def nest_keys(pairs) -> dict:
  out: dict = {}
  for keys, value in pairs:
    node = out
    for k in keys[:-1]:
      node = node.setdefault(k, {})
    node[keys[-1]] = value
  return out


def get_path(tree, keys):
  for k in keys:
    tree = tree[k]
  return tree


_DEFAULT_SHARDING = []


@contextlib.contextmanager
def default_sharding(sharding):
  """Where `load_params` puts leaves that name no sharding, inside the block (e.g. replicated on
  the training mesh, so model-backed rewards can be used by jitted code sharded over it)."""
  _DEFAULT_SHARDING.append(sharding)
  try:
    yield
  finally:
    _DEFAULT_SHARDING.pop()


def _default_sharding():
  if _DEFAULT_SHARDING:
    return _DEFAULT_SHARDING[-1]
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def load_params(component_dir: str, abstract_state=None, shardings=None) -> nnx.State:
  """Restores a component's parameters as an nnx.State of jax.Arrays.

  `abstract_state`: the nnx Param state (ShapeDtypeStruct leaves) to restore
  into; its dtypes are the restored dtypes. Default: built from
  `component_dir`/config.json. `shardings`: a Sharding for every leaf, or a
  tree like `abstract_state` of Shardings; default: each leaf's own
  `.sharding`, else the first device.
  """
  params_dir = params_dir_of(component_dir)
  if abstract_state is None:
    component = components_lib.get(os.path.basename(os.path.normpath(component_dir)))
    cfg = component.config_from_hf(component.read_config(component_dir))
    abstract_state = nnx.state(component.build_abstract(cfg), nnx.Param)
  abstract = flatten(abstract_state)
  if shardings is None:
    shard = {k: getattr(v, "sharding", None) or _default_sharding() for k, v in abstract.items()}
  elif isinstance(shardings, jax.sharding.Sharding):
    shard = {k: shardings for k in abstract}
  else:
    shard = flatten(shardings)
    if set(shard) != set(abstract):
      raise ValueError(f"shardings paths differ from abstract_state: "
                       f"{sorted(set(shard) ^ set(abstract))}")
  stored = stored_leaves(params_dir)
  mismatched = [f"{k}: checkpoint {list(stored[k].shape)}, model {list(v.shape)}"
                for k, v in abstract.items() if k in stored and stored[k].shape != tuple(v.shape)]
  check_coverage(params_dir, sorted(set(abstract) - set(stored)),
                 sorted(set(stored) - set(abstract)), mismatched)
  item = nest_keys(
      (stored[k].keys, jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shard[k]))
      for k, v in abstract.items())
  restore_args = ocp.checkpoint_utils.construct_restore_args(item)
  restored = ocp.PyTreeCheckpointer().restore(
      os.path.abspath(params_dir), args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args))
  state = jax.tree.map(lambda x: x, abstract_state)
  nnx.replace_by_pure_dict(state, nest({k: get_path(restored, stored[k].keys) for k in abstract}))
  return state


def load_model(component_dir: str, **config_overrides):
  """Builds a component's config and nnx model from `component_dir` and fills its weights.

  The folder name picks the component (e.g. .../transformer); keyword
  arguments replace config fields (e.g. param_dtype=jnp.bfloat16).
  """
  component = components_lib.get(os.path.basename(os.path.normpath(component_dir)))
  cfg = component.config_from_hf(component.read_config(component_dir), **config_overrides)
  graphdef, abstract, rest = component.build(cfg)
  params = load_params(component_dir, abstract)
  return nnx.merge(graphdef, params, rest)
