"""Reading parameter checkpoints (Orbax folders of one model's weights) onto explicit shardings.

A converted folder holds `config.json` and `params/` (what `python -m checkpoints_convert` and the
reward-model converters write). Restores always name where the leaves go: a Sharding for every
leaf, or a tree of them like the abstract state, so weights cached per folder can never be handed
to code running on another mesh.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from glmrl.errors import UserError

# Where a component's parameter pytree lives inside its converted folder.
PARAMS_DIR = "params"
CONFIG_NAME = "config.json"


def flax_path_str(path) -> str:
  """('text', 'layers', 0, 'kernel') -> 'text.layers.0.kernel'; also jax tree paths (keys, indices, attributes)."""
  parts = []
  for p in path:
    for attr in ("key", "idx", "name"):
      if hasattr(p, attr):
        parts.append(str(getattr(p, attr)))
        break
    else:
      parts.append(str(p))
  return ".".join(parts)


def flatten(tree) -> dict[str, Any]:
  """{'a.layers.0.kernel': leaf} of an nnx.State or a nested dict."""
  if isinstance(tree, nnx.State):
    tree = nnx.to_pure_dict(tree)
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
  return {flax_path_str(path): leaf for path, leaf in leaves}


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


def check_coverage(where: str, missing=(), unexpected=(), mismatched=()):
  """One UserError listing every missing / unexpected / mis-shaped key."""
  lines = []
  if missing:
    lines.append(f"missing ({len(missing)}): " + ", ".join(missing))
  if unexpected:
    lines.append(f"unexpected ({len(unexpected)}): " + ", ".join(unexpected))
  if mismatched:
    lines.append(f"shape mismatch ({len(mismatched)}): " + "; ".join(mismatched))
  if lines:
    raise UserError(f"{where}:\n  " + "\n  ".join(lines))


def params_dir_of(directory: str) -> str:
  """`directory`/params if present, else `directory` itself when it is an Orbax checkpoint."""
  sub = os.path.join(directory, PARAMS_DIR)
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
    keys = tuple(flax_path_str([p]) for p in path)
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


def first_device() -> jax.sharding.Sharding:
  """The default placement of models used outside a mesh (tests, tools)."""
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def restore_params(directory: str, abstract_state, shardings) -> nnx.State:
  """A model's parameters from `directory` (or its `params/`), as an nnx.State of jax.Arrays.

  `abstract_state`: the nnx Param state (ShapeDtypeStruct leaves) to restore into; its dtypes are
  the restored dtypes. `shardings`: one Sharding for every leaf, or a tree like `abstract_state`.
  Every missing, unexpected or mis-shaped leaf is listed in one ValueError before any is read.
  """
  params_dir = params_dir_of(directory)
  abstract = flatten(abstract_state)
  if isinstance(shardings, jax.sharding.Sharding):
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


def holds_config(directory, name: str = CONFIG_NAME) -> bool:
  """Whether `directory` (a path, or None when a config leaves it unset) is a folder with `name` in it."""
  return isinstance(directory, str) and os.path.isfile(os.path.join(directory, name))


def read_config(directory: str, from_hf: Callable[[dict], Any], hint: str, name: str = CONFIG_NAME):
  """`from_hf` of `directory`/`name`; FileNotFoundError with `hint` (how to make the folder) when absent."""
  path = os.path.join(directory, name)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{directory!r} has no {name} ({hint})")
  with open(path) as f:
    try:
      return from_hf(json.load(f))
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e})") from e
