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

A run that trained the DiT decoder holds a `decoder_params` item in its step folders (the DiT's
Param state with a converted `transformer/params`' paths, or with `decoder_lora.json` its adapters),
and no `params` when it did not train the generator (whose folder is then the source's): the
folder's `transformer/` is the trained DiT (its config.json the source's, else the run's
`dit_config.json`), or the source's base with the adapters written in diffusers' LoRA format under
`adapters/transformer/` (or merged into it with --merge_lora).
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
from glmrl.policy import registry as policy_registry

DEFAULT_MAX_SHARD_SIZE = "5GB"
TRAINING_CONFIG = "ar_config.json"
# A converted GLM-Image folder's component that marks it as one (every converted folder holds it).
SOURCE_MARKER = "vision_language_encoder"


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
  integer step folders) or the run's workdir containing `checkpoints/`. A step holds the
  generator's `params` item, the DiT decoder's `decoder_params`, or both (a run that trains only
  the decoder writes no `params`: the params dir returned is then absent).
  """
  for root in (ckpt_dir, os.path.join(ckpt_dir, "checkpoints")):
    config = os.path.join(root, TRAINING_CONFIG)
    if os.path.isfile(config):
      break
  else:
    return None
  items = [saved.params for saved in policy_registry.SAVED.values()]
  steps = sorted(int(n) for n in os.listdir(root)
                 if n.isdigit() and any(os.path.isdir(os.path.join(root, n, i)) for i in items))
  if not steps:
    raise ValueError(f"{root}: no step folder with a {' or a '.join(repr(i) for i in items)} item")
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
                    f"there is no released folder its other pipeline components could come from")
  if not os.path.isdir(os.path.join(source, SOURCE_MARKER, PARAMS_DIR)):
    raise ValueError(f"source checkpoint {source!r} ({origin}) is not a converted GLM-Image folder (no "
                     f"{SOURCE_MARKER}/{PARAMS_DIR}); pass --source_dir=<the converted folder "
                     f"the run trained from>, or --source_dir='' for the generator alone")
  return os.path.abspath(source), None


def _check_same_model(component, role: str, source_config: dict, source_path: str, run_config: dict, run_path: str):
  """The source's config of a trained model must describe the trained one (same architecture)."""
  a, b = component.config_from_hf(source_config), component.config_from_hf(run_config)
  if a != b:
    diff = [f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]
    raise ValueError(f"{source_path} describes a different {role} than the trained one ({run_path}): "
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


def _read_json(path: str) -> dict | None:
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e})") from e


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  """A model a training run trained: one item of its step folder."""
  component: components_lib.Component
  role: str                  # "generator" / "decoder", in messages
  item_dir: str              # the step's Orbax item: the model's whole Param state, or with `lora` its adapters
  lora: dict | None          # the run's LoRA record ({"rank", "alpha", "targets", "base"}), None: full fine-tuning
  lora_file: str             # where that record is (or would be)
  config_path: str           # the run's HF config of the model (absent when the run recorded none)


def trained_models(params_dir: str, config_path: str, use_ema: bool = False) -> list[TrainedModel]:
  """Each model a policy of the run trained (`glmrl.policy.registry.SAVED`: the AR generator's `params`, the
  DiT's `decoder_params`), where the step holds its item; with `use_ema` a policy's moving average (its ema item,
  in the same layout) where the run kept one."""
  run_dir, step_dir = os.path.dirname(config_path), os.path.dirname(params_dir)
  found = {name: saved for name, saved in policy_registry.SAVED.items()
           if os.path.isdir(os.path.join(step_dir, saved.params))}
  averaged = {name for name, saved in found.items() if use_ema and os.path.isdir(os.path.join(step_dir, saved.ema))}
  if use_ema and not averaged:
    items = " or ".join(repr(saved.ema) for saved in found.values())
    raise ValueError(f"--use_ema: {step_dir} holds no {items} item (the run kept no moving average of its trained "
                     "models: config.decoder.ema.every=0)")
  return [TrainedModel(components_lib.get(saved.export_component), saved.role,
                       os.path.join(step_dir, saved.ema if name in averaged else saved.params),
                       _read_json(os.path.join(run_dir, saved.adapters_file)),
                       os.path.join(run_dir, saved.adapters_file), os.path.join(run_dir, saved.model_config_file))
          for name, saved in found.items()]


@dataclasses.dataclass(frozen=True)
class _ModelExport:
  """What is written of one trained model, decided (and validated) before anything is written."""
  model: TrainedModel
  source_dir: str | None     # the source's folder of the component: its files, and the adapters' base
  weights_dir: str | None    # the Param state the component's weights come from; None: the component is not written
  config: dict | None
  plan: list[Exported] | None
  adjust: Callable | None    # merges the adapters into the base's kernels
  adapters: dict | None      # {flax path: array}, written as an adapter (not merged)
  not_written: str | None    # why the trained component is not written though the run has its weights


def _plan_model(m: TrainedModel, source: str | None, why_not: str | None, merge_lora: bool) -> _ModelExport:
  component = m.component
  source_dir = os.path.join(source, component.name) if source else None
  no_base = why_not
  if source_dir and not os.path.isdir(os.path.join(source_dir, PARAMS_DIR)):
    source_dir, no_base = None, f"the source checkpoint {source} has no {component.name}/{PARAMS_DIR}"
  run_config = _read_json(m.config_path)
  source_config = component.read_config(source_dir) if source_dir else None
  if run_config is not None and source_config is not None:
    _check_same_model(component, m.role, source_config, os.path.join(source_dir, component.config_name),
                      run_config, m.config_path)
  config = run_config if run_config is not None else source_config
  weights_dir, adjust, adapters, not_written = m.item_dir, None, None, None
  if m.lora is not None:
    # The item holds adapters; the component's weights are its base's, from the source folder.
    reader = OrbaxLeafReader(m.item_dir)
    adapters = {p: reader.read(p) for p in reader.leaves}
    pairs = peft_lib.adapter_pairs(adapters)
    if merge_lora and source_dir is None:
      raise ValueError(f"--merge_lora needs the base the adapters of {m.item_dir} were trained on: {no_base}")
    weights_dir = os.path.join(source_dir, PARAMS_DIR) if source_dir else None
    if merge_lora:
      scale = float(m.lora["alpha"]) / int(m.lora["rank"])
      adjust = lambda path, leaf: peft_lib.merge_kernel(leaf, *pairs[path], scale) if path in pairs else leaf
  elif config is None:
    weights_dir = None
    not_written = (f"the trained {component.name} ({m.item_dir}) was not written: the run recorded no config of "
                   f"its {m.role} ({m.config_path} is missing) and there is no {component.name}/"
                   f"{component.config_name} to take instead: {no_base}")
  plan = plan_export(component, weights_dir, config) if weights_dir else None
  if adapters is not None and weights_dir:
    shapes = {p: leaf.shape for p, leaf in params_lib.stored_leaves(weights_dir).items()}
    peft_lib.check_fit(pairs, shapes, weights_dir)
  return _ModelExport(m, source_dir, weights_dir, config, plan, adjust, None if merge_lora else adapters,
                      not_written)


def _adapter_dir(hf_out_dir: str, component: components_lib.Component) -> str:
  return os.path.join(hf_out_dir, peft_lib.ADAPTERS_DIR, component.name)


def _write_adapter(e: _ModelExport, out_dir: str) -> tuple[str, dict]:
  """(format, summary): a diffusers model's adapter in diffusers' LoRA format (its pipeline loads it with
  `pipe.<component>.load_lora_adapter`), a transformers model's as a PEFT adapter folder."""
  m = e.model
  record_name = os.path.basename(m.lora_file)
  if m.component.library[0] == "diffusers":
    return "diffusers LoRA", peft_lib.write_diffusers_adapter(
        out_dir, e.adapters, m.lora, m.component.key_map(), prefix=m.component.name, record_name=record_name)
  return "PEFT", peft_lib.write_peft_adapter(out_dir, e.adapters, m.lora, m.component.key_map(),
                                             base_model=e.source_dir, record_name=record_name)


def _write_model(e: _ModelExport, hf_out_dir: str, step: int, max_shard_size, log) -> dict:
  component, exported = e.model.component, {}
  if e.weights_dir:
    out = os.path.join(hf_out_dir, component.name)
    if e.source_dir is None:
      shutil.copy2(e.model.config_path, os.path.join(out, component.config_name))
    else:
      # The source's files (its full config.json, the generator's generation_config.json with the sampling defaults).
      hf_to_flax.copy_component_files(e.source_dir, out)
      _match_dtype(os.path.join(out, component.config_name), e.plan, log)
    exported[component.name] = export_component(component, e.weights_dir, e.config, out,
                                                max_shard_size=max_shard_size, plan=e.plan, adjust=e.adjust)
    what = "trained" if e.model.lora is None else ("base + merged adapters" if e.adjust else "base")
    log(f"exported {component.name} ({what}) of step {step}: {exported[component.name]['tensors']} tensors -> "
        f"{exported[component.name]['files']}")
  if e.adapters is not None:
    adapter_dir = _adapter_dir(hf_out_dir, component)
    kind, written = _write_adapter(e, adapter_dir)
    exported[f"{peft_lib.ADAPTERS_DIR}/{component.name}"] = written
    log(f"wrote the {kind} adapter of step {step} ({written['modules']} modules, rank {e.model.lora['rank']}) "
        f"-> {adapter_dir}")
  return exported


def _export_training(params_dir: str, config_path: str, step: int, hf_out_dir: str, source_dir: str | None,
                     max_shard_size, log, merge_lora: bool = False, use_ema: bool = False) -> dict:
  run_dir = os.path.dirname(config_path)
  models = trained_models(params_dir, config_path, use_ema)
  if merge_lora and all(m.lora is None for m in models):
    records = " or ".join(os.path.basename(m.lora_file) for m in models)
    roles = " and ".join(m.role for m in models)
    raise ValueError(f"--merge_lora: {run_dir} holds no LoRA adapters (no {records}); its {roles} "
                     f"{'is' if len(models) == 1 else 'are'} exported whole without it")
  source, why_not = training_source(run_dir, source_dir)
  exports = [_plan_model(m, source, why_not, merge_lora) for m in models]
  trained = {m.component.name for m in models}
  others = [n for n in _converted_components(source) if n not in trained] if source is not None else []
  plans = _plan_components(source, others) if source is not None else {}
  # Everything is validated before anything is written.
  for n in (*(e.model.component.name for e in exports if e.weights_dir), *others):
    _fresh_dir(os.path.join(hf_out_dir, n))
  for e in exports:
    if e.adapters is not None:
      _fresh_dir(_adapter_dir(hf_out_dir, e.model.component))
  exported = {}
  for e in exports:
    exported.update(_write_model(e, hf_out_dir, step, max_shard_size, log))
  copied = []
  if source is not None:
    exported.update(_export_components(source, others, hf_out_dir, max_shard_size, log, plans))
    copied = hf_to_flax.copy_pipeline_files(source, hf_out_dir, log)
  reasons = [] if source is not None else [
      f"only {', '.join(exported)} {'was' if len(exported) == 1 else 'were'} written: {why_not}"]
  reasons += [e.not_written for e in exports if e.not_written]
  result = {"exported": exported, "skipped": [], "copied": copied, "step": step, "source": source,
            "incomplete_reason": "; ".join(reasons) or None}
  return _report(result, hf_out_dir, log)


def export(ckpt_dir: str, hf_out_dir: str, *, step: int | None = None, source_dir: str | None = None,
           max_shard_size=DEFAULT_MAX_SHARD_SIZE, merge_lora: bool = False, use_ema: bool = False,
           log: Callable[[str], None] = print) -> dict:
  """Writes an HF GLM-Image folder from a converted or a training checkpoint.

  A LoRA run writes the pipeline folder of its base (the source folder) and its adapter in PEFT's
  format under `adapters/vision_language_encoder/`; with `merge_lora` the generator's weights are the
  base's with the adapters merged in, and no adapter is written. A run that trained the DiT decoder
  (`decoder_params` in the step) writes `transformer/` from it; with DiT adapters the base's
  `transformer/` and `adapters/transformer/pytorch_lora_weights.safetensors` (diffusers' LoRA format:
  `pipe.transformer.load_lora_adapter(<out>/adapters/transformer, weight_name=...)`), or with
  `merge_lora` the adapters merged into the base. `use_ema`: the decoder's moving average (`decoder_ema`)
  is written in place of its trained parameters.

  Returns {"exported": {component: {"tensors", "files"}}, "skipped", "copied", "complete",
  "incomplete_reason"} plus, for a training checkpoint, "step" and "source" (the converted folder
  the other components came from, or None).
  """
  if not os.path.isdir(ckpt_dir):
    raise ValueError(f"--ckpt_dir {ckpt_dir!r} is not a directory")
  st.parse_size(max_shard_size)
  training = find_training_checkpoint(ckpt_dir, step)
  if training is not None:
    return _export_training(*training, hf_out_dir, source_dir, max_shard_size, log, merge_lora, use_ema)
  if use_ema:
    raise ValueError(f"--use_ema is for a training run whose decoder kept a moving average; {ckpt_dir} is not a "
                     "training checkpoint")
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
