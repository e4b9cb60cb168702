"""Orbax parameter checkpoints -> HF safetensors folders, one tensor at a time.

Input is either a converted checkpoint (the layout `hf_to_flax.convert_pipeline`
writes) or a training run's Orbax CheckpointManager directory whose step
folders hold a `params` item with the AR generator's state, next to
`ar_config.json` and `source.json`.

A training run is exported as a complete pipeline folder (what
`diffusers.GlmImagePipeline.from_pretrained` loads): the trained generator
plus every other component and file of the converted folder the run started
from (recorded in source.json, or given as `source_dir`), the generator's
generation_config.json included. A run of a random preset has no such folder:
only the generator is written, and the result says why it is incomplete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Callable

import numpy as np
import orbax.checkpoint as ocp

from checkpoints_convert import components as components_lib
from checkpoints_convert import hf_to_flax
from checkpoints_convert import peft as peft_lib
from checkpoints_convert import safetensors_stream as st
from glmrl.checkpoint import manager as train_ckpt
from glmrl.checkpoint import params as params_lib
from glmrl.checkpoint.params import PARAMS_DIR

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
                 if n.isdigit() and os.path.isdir(os.path.join(root, n, PARAMS_DIR)))
  if not steps:
    raise ValueError(f"{root}: no step folder with a '{PARAMS_DIR}' item")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise ValueError(f"--step {step} not in {root}; available steps: {steps}")
  return os.path.join(root, str(step), PARAMS_DIR), config, step


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


def _report(result: dict, hf_out_dir: str, log) -> dict:
  """Adds "complete" and "incomplete_reason" (a reason given by the caller, else what is missing) and says it."""
  reason = result.get("incomplete_reason") or pipeline_incomplete(hf_out_dir)
  result.update(complete=reason is None, incomplete_reason=reason)
  if reason is None:
    log(f"wrote a complete GLM-Image pipeline folder: {hf_out_dir}")
  else:
    log(f"warning: {hf_out_dir} is not a complete pipeline folder "
        f"(diffusers.GlmImagePipeline.from_pretrained cannot load it): {reason}")
  return result


def _export_components(src: str, names, hf_out_dir: str, max_shard_size, log, plans: dict) -> dict:
  """Converted components `names` of `src` -> `hf_out_dir`/<name>/ (files copied, weights streamed);
  `plans`: `_plan_components`' output, made before anything is written."""
  exported = {}
  for n in names:
    component, src_n, out = components_lib.get(n), os.path.join(src, n), os.path.join(hf_out_dir, n)
    hf_to_flax.copy_component_files(src_n, out)
    config, plan = plans[n]
    exported[n] = export_component(component, os.path.join(src_n, PARAMS_DIR), config,
                                   out, max_shard_size=max_shard_size, plan=plan)
    log(f"exported {n}: {exported[n]['tensors']} tensors -> {exported[n]['files']}")
  return exported


def _plan_components(src: str, names) -> dict:
  plans = {}
  for n in names:
    component = components_lib.get(n)
    config = component.read_config(os.path.join(src, n))
    plans[n] = (config, plan_export(component, os.path.join(src, n, PARAMS_DIR), config))
  return plans


def _converted_components(directory: str) -> list[str]:
  return [n for n in components_lib.COMPONENTS
          if os.path.isdir(os.path.join(directory, n, PARAMS_DIR))]


def training_source(run_dir: str, source_dir: str | None) -> tuple[str | None, str | None]:
  """(converted folder to take the other components from, None) or (None, why there is none).

  `source_dir` (the command line's --source_dir) overrides what the run recorded in source.json;
  "" asks for the generator alone.
  """
  recorded_at = os.path.join(run_dir, train_ckpt.SOURCE_FILE)
  if source_dir is not None:
    source, origin = source_dir, "--source_dir"
    if not source:
      return None, "--source_dir='' asks for the trained generator alone"
  else:
    source, origin = train_ckpt.read_source(run_dir), f"recorded in {recorded_at}"
    if source is None:
      return None, (f"the run recorded no source checkpoint ({recorded_at} is missing: the run predates it); "
                    f"pass --source_dir=<the converted folder it trained from> to write a complete folder")
    if not source:
      return None, (f"the run trained a random preset (no config.model.checkpoint_dir, {recorded_at}), so "
                    f"there is no text_encoder, transformer, vae, processor, tokenizer or scheduler "
                    f"belonging to its generator")
  if not os.path.isdir(os.path.join(source, TRAINING_COMPONENT, PARAMS_DIR)):
    raise ValueError(f"source checkpoint {source!r} ({origin}) is not a converted GLM-Image folder (no "
                     f"{TRAINING_COMPONENT}/{PARAMS_DIR}); pass --source_dir=<the converted folder "
                     f"the run trained from>, or --source_dir='' for the generator alone")
  return os.path.abspath(source), None


def _check_same_generator(component, source_config: dict, source_path: str, run_config: dict, run_path: str):
  """The source's generator config must describe the trained one (same architecture)."""
  a, b = component.config_from_hf(source_config), component.config_from_hf(run_config)
  if a != b:
    diff = [f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]
    raise ValueError(f"{source_path} describes a different generator than the trained one ({run_path}): "
                     f"{', '.join(diff)} differ; is this the converted folder the run trained from?")


def _match_dtype(config_path: str, plan: list[Exported], log):
  """Sets the config's dtype to the exported tensors' one (trained parameters may be stored in another
  dtype than the source's), so `from_pretrained(dtype="auto")` loads them as trained."""
  dtypes = {np.dtype(e.dtype).name for e in plan}
  if len(dtypes) != 1:
    return
  (dtype,) = dtypes
  with open(config_path) as f:
    config = json.load(f)
  changed = {k: config[k] for k in ("dtype", "torch_dtype") if k in config and config[k] != dtype}
  if changed:
    config.update({k: dtype for k in changed})
    with open(config_path, "w") as f:
      json.dump(config, f, indent=2, sort_keys=True)
    log(f"{config_path}: {', '.join(f'{k} {v} -> {dtype}' for k, v in changed.items())} (the trained tensors' dtype)")


def _read_lora(run_dir: str) -> dict | None:
  path = os.path.join(run_dir, train_ckpt.LORA_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def _export_training(params_dir: str, config_path: str, step: int, hf_out_dir: str, source_dir: str | None,
                     max_shard_size, log, merge_lora: bool = False) -> dict:
  run_dir = os.path.dirname(config_path)
  with open(config_path) as f:
    run_config = json.load(f)
  component = components_lib.get(TRAINING_COMPONENT)
  lora = _read_lora(run_dir)
  if merge_lora and lora is None:
    raise ValueError(f"--merge_lora: {run_dir} holds no LoRA adapters (no {train_ckpt.LORA_FILE}); its generator "
                     "is exported whole without it")
  source, why_not = training_source(run_dir, source_dir)
  adapters, adjust, generator_dir = None, None, params_dir
  if lora is not None:
    # The run's params are adapters; the generator's weights are its base's, from the source folder.
    reader = OrbaxLeafReader(params_dir)
    adapters = {p: reader.read(p) for p in reader.leaves}
    pairs = peft_lib.adapter_pairs(adapters)
    if merge_lora and source is None:
      raise ValueError(f"--merge_lora needs the base the adapters were trained on: {why_not}")
    generator_dir = os.path.join(source, component.name, PARAMS_DIR) if source else None
    if merge_lora:
      scale = float(lora["alpha"]) / int(lora["rank"])
      adjust = lambda path, leaf: peft_lib.merge_kernel(leaf, *pairs[path], scale) if path in pairs else leaf
  plan = plan_export(component, generator_dir, run_config) if generator_dir else None
  others, plans = [], {}
  if source is not None:
    source_ar = os.path.join(source, component.name)
    _check_same_generator(component, component.read_config(source_ar),
                          os.path.join(source_ar, component.config_name), run_config, config_path)
    others = [n for n in _converted_components(source) if n != component.name]
    plans = _plan_components(source, others)
  adapter_dir = os.path.join(hf_out_dir, peft_lib.ADAPTERS_DIR, component.name)
  # Everything is validated before anything is written.
  written = [component.name] if generator_dir else []
  for n in (*written, *others):
    _fresh_dir(os.path.join(hf_out_dir, n))
  if adapters is not None and not merge_lora:
    _fresh_dir(adapter_dir)
  out = os.path.join(hf_out_dir, component.name)
  exported = {}
  if generator_dir:
    if source is None:
      shutil.copy2(config_path, os.path.join(out, component.config_name))
    else:
      # The source's files (its full config.json, generation_config.json with the sampling defaults).
      hf_to_flax.copy_component_files(source_ar, out)
      _match_dtype(os.path.join(out, component.config_name), plan, log)
    exported[component.name] = export_component(component, generator_dir, run_config, out,
                                                max_shard_size=max_shard_size, plan=plan, adjust=adjust)
    what = "trained" if lora is None else ("base + merged adapters" if merge_lora else "base")
    log(f"exported {component.name} ({what}) of step {step}: {exported[component.name]['tensors']} tensors -> "
        f"{exported[component.name]['files']}")
  if adapters is not None and not merge_lora:
    written_adapter = peft_lib.write_peft_adapter(adapter_dir, adapters, lora, component.key_map(),
                                                  base_model=os.path.join(source, component.name) if source else None)
    exported[f"{peft_lib.ADAPTERS_DIR}/{component.name}"] = written_adapter
    log(f"wrote the PEFT adapter of step {step} ({written_adapter['modules']} modules, rank {lora['rank']}) "
        f"-> {adapter_dir}")
  copied = []
  if source is not None:
    exported.update(_export_components(source, others, hf_out_dir, max_shard_size, log, plans))
    copied = hf_to_flax.copy_pipeline_files(source, hf_out_dir, log)
  written_alone = "the PEFT adapter alone" if lora is not None else f"only {component.name}"
  result = {"exported": exported, "skipped": [], "copied": copied, "step": step, "source": source,
            "incomplete_reason": None if source is not None else f"{written_alone} was written: {why_not}"}
  return _report(result, hf_out_dir, log)


def export(ckpt_dir: str, hf_out_dir: str, *, step: int | None = None, source_dir: str | None = None,
           max_shard_size=DEFAULT_MAX_SHARD_SIZE, merge_lora: bool = False,
           log: Callable[[str], None] = print) -> dict:
  """Writes an HF GLM-Image folder from a converted or a training checkpoint.

  A LoRA run writes the pipeline folder of its base (the source folder) and its adapter in PEFT's
  format under `adapters/vision_language_encoder/`; with `merge_lora` the generator's weights are the
  base's with the adapters merged in, and no adapter is written.

  Returns {"exported": {component: {"tensors", "files"}}, "skipped", "copied", "complete",
  "incomplete_reason"} plus, for a training checkpoint, "step" and "source" (the converted folder
  the other components came from, or None).
  """
  if not os.path.isdir(ckpt_dir):
    raise ValueError(f"--ckpt_dir {ckpt_dir!r} is not a directory")
  st.parse_size(max_shard_size)
  training = find_training_checkpoint(ckpt_dir, step)
  if training is not None:
    return _export_training(*training, hf_out_dir, source_dir, max_shard_size, log, merge_lora)
  if merge_lora:
    raise ValueError(f"--merge_lora is for a LoRA training run; {ckpt_dir} is not a training checkpoint")
  if step is not None:
    raise ValueError(f"--step given but {ckpt_dir} is not a training checkpoint "
                     f"(no {TRAINING_CONFIG} in it or in its checkpoints/)")
  if source_dir is not None:
    raise ValueError(f"--source_dir is for a training checkpoint; {ckpt_dir} is not one "
                     f"(no {TRAINING_CONFIG} in it or in its checkpoints/): its own components are exported")
  present = _converted_components(ckpt_dir)
  if not present:
    raise ValueError(f"{ckpt_dir}: neither a converted checkpoint (<component>/params/) "
                     f"nor a training checkpoint ({TRAINING_CONFIG})")
  skipped = [n for n in components_lib.COMPONENTS if n not in present]
  plans = _plan_components(ckpt_dir, present)
  for n in present:
    _fresh_dir(os.path.join(hf_out_dir, n))
  for n in skipped:
    log(f"skipped {n}: not in {ckpt_dir}")
  exported = _export_components(ckpt_dir, present, hf_out_dir, max_shard_size, log, plans)
  copied = hf_to_flax.copy_pipeline_files(ckpt_dir, hf_out_dir, log)
  return _report({"exported": exported, "skipped": skipped, "copied": copied, "incomplete_reason": None},
                 hf_out_dir, log)
