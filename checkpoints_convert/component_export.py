"""One converted component's Orbax parameters -> its HF safetensors files, one tensor at a time (`plan_export`
checks every tensor before `export_component` writes any), and a converted folder's components exported whole."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np
import orbax.checkpoint as ocp

from checkpoints_convert import components as components_lib
from checkpoints_convert import hf_to_flax
from checkpoints_convert import safetensors_stream as st
from glmrl.checkpoint import params as params_lib
from glmrl.checkpoint.params import PARAMS_DIR
from glmrl.errors import UserError

DEFAULT_MAX_SHARD_SIZE = "5GB"


@dataclasses.dataclass(frozen=True)
class Exported:
  hf_key: str
  flax_path: str
  transform: Any
  hf_shape: tuple[int, ...]
  dtype: np.dtype


def _hf_shape(transform, flax_shape, hf_key):
  if not hasattr(transform, "hf_shape"):
    raise ValueError(f"{hf_key}: transform {transform!r} has no hf_shape(flax_shape)")
  return tuple(int(d) for d in transform.hf_shape(flax_shape))


def plan_export(component: components_lib.Component, params_dir: str, config: dict) -> list[Exported]:
  """Every stored leaf mapped to its HF key, in natural HF key order; raises on coverage/shape errors."""
  cfg = component.config_from_hf(config)
  expected = hf_to_flax.expected_params(component, cfg)
  stored = params_lib.stored_leaves(params_dir)
  key_map = component.key_map()
  out, unexpected, mismatched, hf_keys = [], [], [], {}
  for path, leaf in stored.items():
    match = key_map.flax_to_hf(path)
    if match is None or path not in expected:
      unexpected.append(path)
      continue
    hf_key, transform = match
    if hf_key in hf_keys:
      unexpected.append(f"{path} (-> {hf_key}, already written for {hf_keys[hf_key]})")
      continue
    hf_keys[hf_key] = path
    want = tuple(expected[path].shape)
    if leaf.shape != want:
      mismatched.append(f"{path}: checkpoint {list(leaf.shape)}, model {list(want)}")
      continue
    out.append(Exported(hf_key, path, transform, _hf_shape(transform, leaf.shape, hf_key), leaf.dtype))
  missing = sorted(set(expected) - set(stored))
  params_lib.check_coverage(f"{component.name}: {params_dir}", missing, unexpected, mismatched)
  return sorted(out, key=lambda e: st.natural_key(e.hf_key))


class OrbaxLeafReader:
  """Restores single leaves of an Orbax PyTree checkpoint as numpy arrays."""

  def __init__(self, params_dir: str):
    self.params_dir = os.path.abspath(params_dir)
    self.leaves = params_lib.stored_leaves(params_dir)
    self._ckptr = ocp.PyTreeCheckpointer()

  def read(self, flax_path: str) -> np.ndarray:
    keys = self.leaves[flax_path].keys
    item = params_lib.nest_keys([(keys, 0)])
    restore_args = params_lib.nest_keys([(keys, ocp.RestoreArgs(restore_type=np.ndarray))])
    restored = self._ckptr.restore(self.params_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=True))
    return np.asarray(params_lib.get_path(restored, keys))


def export_component(component: components_lib.Component, params_dir: str, config: dict,
                     out_dir: str, *, max_shard_size=DEFAULT_MAX_SHARD_SIZE, plan=None, adjust=None) -> dict:
  """Writes `out_dir`/{config.json, weights} for one component; `adjust(flax path, array)`, when
  given, changes each leaf as it is read (merging LoRA updates into the base kernels)."""
  limit = st.parse_size(max_shard_size)
  if plan is None:
    plan = plan_export(component, params_dir, config)
  reader = OrbaxLeafReader(params_dir)
  by_key = {e.hf_key: e for e in plan}

  def read(hf_key):
    e = by_key[hf_key]
    leaf = reader.read(e.flax_path)
    return e.transform.to_hf(adjust(e.flax_path, leaf) if adjust else leaf)

  specs = [st.TensorSpec(e.hf_key, e.hf_shape, e.dtype) for e in plan]
  files = st.write_safetensors(out_dir, component.weights_name, specs, read, max_shard_size=limit)
  return {"tensors": len(plan), "files": [os.path.basename(f) for f in files]}


def fresh_dir(path: str):
  if os.path.isdir(path) and os.listdir(path):
    raise UserError(f"{path} exists and is not empty; choose an empty --hf_out_dir")
  os.makedirs(path, exist_ok=True)


def pipeline_incomplete(out_dir: str) -> str | None:
  """None when `out_dir` holds every component its model_index.json lists, else what is missing."""
  path = os.path.join(out_dir, components_lib.MODEL_INDEX)
  if not os.path.isfile(path):
    return f"no {components_lib.MODEL_INDEX} in {out_dir}"
  with open(path) as f:
    index = json.load(f)
  missing = [n for n in index if not n.startswith("_") and not os.path.isdir(os.path.join(out_dir, n))]
  if missing:
    return f"{', '.join(missing)} listed in {path} but not written"
  return None


def report(result: dict, hf_out_dir: str, log) -> dict:
  """Adds "complete" and "incomplete_reason" (a reason given by the caller, else what is missing) and says it."""
  reason = result.get("incomplete_reason") or pipeline_incomplete(hf_out_dir)
  result.update(complete=reason is None, incomplete_reason=reason)
  if reason is None:
    log(f"wrote a complete GLM-Image pipeline folder: {hf_out_dir}")
  else:
    log(f"warning: {hf_out_dir} is not a complete pipeline folder "
        f"(diffusers.GlmImagePipeline.from_pretrained cannot load it): {reason}")
  return result


def export_components(src: str, names, hf_out_dir: str, max_shard_size, log, plans: dict) -> dict:
  """Converted components `names` of `src` -> `hf_out_dir`/<name>/ (files copied, weights streamed);
  `plans`: `plan_components`' output, made before anything is written."""
  exported = {}
  for n in names:
    component, src_n, out = components_lib.get(n), os.path.join(src, n), os.path.join(hf_out_dir, n)
    hf_to_flax.copy_component_files(src_n, out)
    config, plan = plans[n]
    exported[n] = export_component(component, os.path.join(src_n, PARAMS_DIR), config,
                                   out, max_shard_size=max_shard_size, plan=plan)
    log(f"exported {n}: {exported[n]['tensors']} tensors -> {exported[n]['files']}")
  return exported


def plan_components(src: str, names) -> dict:
  plans = {}
  for n in names:
    component = components_lib.get(n)
    config = component.read_config(os.path.join(src, n))
    plans[n] = (config, plan_export(component, os.path.join(src, n, PARAMS_DIR), config))
  return plans


def converted_components(directory: str) -> list[str]:
  return [n for n in components_lib.COMPONENTS
          if os.path.isdir(os.path.join(directory, n, PARAMS_DIR))]
