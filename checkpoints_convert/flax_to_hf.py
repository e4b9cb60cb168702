"""Orbax parameter checkpoints -> HF safetensors folders, one tensor at a time.

Input is either a converted checkpoint (the layout `hf_to_flax.convert`
writes) or a training run's Orbax CheckpointManager directory whose step
folders hold a `params` item with the AR generator's state, next to
`ar_config.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Callable

import glmrl  # noqa: F401
import numpy as np
import orbax.checkpoint as ocp

from checkpoints_convert import components as components_lib
from checkpoints_convert import hf_to_flax
from checkpoints_convert import safetensors_stream as st

DEFAULT_MAX_SHARD_SIZE = "5GB"
TRAINING_CONFIG = "ar_config.json"
TRAINING_COMPONENT = "vision_language_encoder"


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
  stored = hf_to_flax.stored_leaves(params_dir)
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
  hf_to_flax.check_coverage(f"{component.name}: {params_dir}", missing, unexpected, mismatched)
  return sorted(out, key=lambda e: st.natural_key(e.hf_key))


class OrbaxLeafReader:
  """Restores single leaves of an Orbax PyTree checkpoint as numpy arrays."""

  def __init__(self, params_dir: str):
    self.params_dir = os.path.abspath(params_dir)
    self.leaves = hf_to_flax.stored_leaves(params_dir)
    self._ckptr = ocp.PyTreeCheckpointer()

  def read(self, flax_path: str) -> np.ndarray:
    keys = self.leaves[flax_path].keys
    item = hf_to_flax.nest_keys([(keys, 0)])
    restore_args = hf_to_flax.nest_keys([(keys, ocp.RestoreArgs(restore_type=np.ndarray))])
    restored = self._ckptr.restore(self.params_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=True))
    return np.asarray(hf_to_flax.get_path(restored, keys))


def export_component(component: components_lib.Component, params_dir: str, config: dict,
                     out_dir: str, *, max_shard_size=DEFAULT_MAX_SHARD_SIZE, plan=None) -> dict:
  """Writes `out_dir`/{config.json, weights} for one component."""
  limit = st.parse_size(max_shard_size)
  if plan is None:
    plan = plan_export(component, params_dir, config)
  reader = OrbaxLeafReader(params_dir)
  by_key = {e.hf_key: e for e in plan}

  def read(hf_key):
    e = by_key[hf_key]
    return e.transform.to_hf(reader.read(e.flax_path))

  specs = [st.TensorSpec(e.hf_key, e.hf_shape, e.dtype) for e in plan]
  files = st.write_safetensors(out_dir, component.weights_name, specs, read, max_shard_size=limit)
  return {"tensors": len(plan), "files": [os.path.basename(f) for f in files]}


def _fresh_dir(path: str):
  if os.path.isdir(path) and os.listdir(path):
    raise ValueError(f"{path} exists and is not empty; choose an empty --hf_out_dir")
  os.makedirs(path, exist_ok=True)


def find_training_checkpoint(ckpt_dir: str, step: int | None = None) -> tuple[str, str, int] | None:
  """(params dir, config path, step) of a training run, or None when `ckpt_dir` is not one.

  `ckpt_dir` is the CheckpointManager directory (holding ar_config.json and
  integer step folders) or the run's workdir containing `checkpoints/`.
  """
  for root in (ckpt_dir, os.path.join(ckpt_dir, "checkpoints")):
    config = os.path.join(root, TRAINING_CONFIG)
    if os.path.isfile(config):
      break
  else:
    return None
  steps = sorted(int(n) for n in os.listdir(root)
                 if n.isdigit() and os.path.isdir(os.path.join(root, n, components_lib.PARAMS_DIR)))
  if not steps:
    raise ValueError(f"{root}: no step folder with a '{components_lib.PARAMS_DIR}' item")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise ValueError(f"--step {step} not in {root}; available steps: {steps}")
  return os.path.join(root, str(step), components_lib.PARAMS_DIR), config, step


def export(ckpt_dir: str, hf_out_dir: str, *, step: int | None = None,
           max_shard_size=DEFAULT_MAX_SHARD_SIZE, log: Callable[[str], None] = print) -> dict:
  """Writes an HF GLM-Image folder from a converted or a training checkpoint."""
  if not os.path.isdir(ckpt_dir):
    raise ValueError(f"--ckpt_dir {ckpt_dir!r} is not a directory")
  st.parse_size(max_shard_size)
  training = find_training_checkpoint(ckpt_dir, step)
  if training is not None:
    params_dir, config_path, found_step = training
    with open(config_path) as f:
      config = json.load(f)
    component = components_lib.get(TRAINING_COMPONENT)
    plan = plan_export(component, params_dir, config)
    out = os.path.join(hf_out_dir, component.name)
    _fresh_dir(out)
    shutil.copy2(config_path, os.path.join(out, component.config_name))
    result = export_component(component, params_dir, config, out,
                              max_shard_size=max_shard_size, plan=plan)
    log(f"exported {component.name} of step {found_step}: {result['tensors']} tensors -> {result['files']}")
    return {"exported": {component.name: result}, "skipped": [], "step": found_step}
  if step is not None:
    raise ValueError(f"--step given but {ckpt_dir} is not a training checkpoint "
                     f"(no {TRAINING_CONFIG} in it or in its checkpoints/)")
  present = [n for n in components_lib.COMPONENTS
             if os.path.isdir(os.path.join(ckpt_dir, n, components_lib.PARAMS_DIR))]
  if not present:
    raise ValueError(f"{ckpt_dir}: neither a converted checkpoint (<component>/params/) "
                     f"nor a training checkpoint ({TRAINING_CONFIG})")
  skipped = [n for n in components_lib.COMPONENTS if n not in present]
  plans = {}
  for n in present:
    component = components_lib.get(n)
    src = os.path.join(ckpt_dir, n)
    config = component.read_config(src)
    plans[n] = (config, plan_export(component, os.path.join(src, components_lib.PARAMS_DIR), config))
  for n in present:
    _fresh_dir(os.path.join(hf_out_dir, n))
  for n in skipped:
    log(f"skipped {n}: not in {ckpt_dir}")
  exported = {}
  for n in present:
    component, src, out = components_lib.get(n), os.path.join(ckpt_dir, n), os.path.join(hf_out_dir, n)
    hf_to_flax.copy_component_files(src, out)
    config, plan = plans[n]
    exported[n] = export_component(component, os.path.join(src, components_lib.PARAMS_DIR), config,
                                   out, max_shard_size=max_shard_size, plan=plan)
    log(f"exported {n}: {exported[n]['tensors']} tensors -> {exported[n]['files']}")
  copied = hf_to_flax.copy_pipeline_files(ckpt_dir, hf_out_dir, log)
  return {"exported": exported, "skipped": skipped, "copied": copied}
