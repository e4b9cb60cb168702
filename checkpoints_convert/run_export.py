"""A training run's folder -> the HF pipeline folder of what it trained: each model a policy of the run trained
(`glmrl.policy.registry.SAVED`: its step item, its LoRA record, its HF config), written whole, as its source's base
with adapters (PEFT or diffusers' LoRA format), or with the adapters merged; every other component and file from
the converted folder the run started from (`training_source`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Callable

import numpy as np

from checkpoints_convert import component_export
from checkpoints_convert import components as components_lib
from checkpoints_convert import hf_to_flax
from checkpoints_convert import peft as peft_lib
from glmrl.checkpoint import manager as train_ckpt
from glmrl.checkpoint import params as params_lib
from glmrl.checkpoint.params import PARAMS_DIR
from glmrl.errors import UserError
from glmrl.policy import registry as policy_registry

TRAINING_CONFIG = train_ckpt.AR_CONFIG_FILE  # every training run's checkpoints folder holds it
# A converted GLM-Image folder's component that marks it as one (every converted folder holds it).
SOURCE_MARKER = "vision_language_encoder"


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
    raise UserError(f"{root}: no step folder with a {' or a '.join(repr(i) for i in items)} item")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise UserError(f"--step {step} not in {root}; available steps: {steps}")
  return os.path.join(root, str(step), PARAMS_DIR), config, step


def training_workdir(ckpt_dir: str) -> str | None:
  """The workdir of the training run `ckpt_dir` is (or whose checkpoints/ it is), or None for a converted folder:
  the folder holding the run's checkpoints/ (where its samples, logs and records are)."""
  for root in (os.path.join(ckpt_dir, "checkpoints"), ckpt_dir):
    if os.path.isfile(os.path.join(root, TRAINING_CONFIG)):
      return os.path.dirname(os.path.abspath(root))
  return None


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
    raise UserError(f"source checkpoint {source!r} ({origin}) is not a converted GLM-Image folder (no "
                    f"{SOURCE_MARKER}/{PARAMS_DIR}); pass --source_dir=<the converted folder "
                    f"the run trained from>, or --source_dir='' for the generator alone")
  return os.path.abspath(source), None


def _check_same_model(component, role: str, source_config: dict, source_path: str, run_config: dict, run_path: str):
  """The source's config of a trained model must describe the trained one (same architecture)."""
  a, b = component.config_from_hf(source_config), component.config_from_hf(run_config)
  if a != b:
    diff = [f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]
    raise UserError(f"{source_path} describes a different {role} than the trained one ({run_path}): "
                    f"{', '.join(diff)} differ; is this the converted folder the run trained from?")


def _match_dtype(config_path: str, plan: list[component_export.Exported], log):
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
      raise UserError(f"{path}: not valid JSON ({e})") from e


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
  averaged = {name for name, saved in found.items()
              if use_ema and saved.ema and os.path.isdir(os.path.join(step_dir, saved.ema))}
  if use_ema and not averaged:
    items = " or ".join(repr(saved.ema) for saved in found.values() if saved.ema) or "moving-average"
    raise UserError(f"--use_ema: {step_dir} holds no {items} item (the run kept no moving average of its trained "
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
  plan: list[component_export.Exported] | None
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
    reader = component_export.OrbaxLeafReader(m.item_dir)
    adapters = {p: reader.read(p) for p in reader.leaves}
    pairs = peft_lib.adapter_pairs(adapters)
    if merge_lora and source_dir is None:
      raise UserError(f"--merge_lora needs the base the adapters of {m.item_dir} were trained on: {no_base}")
    weights_dir = os.path.join(source_dir, PARAMS_DIR) if source_dir else None
    if merge_lora:
      scale = float(m.lora["alpha"]) / int(m.lora["rank"])
      adjust = lambda path, leaf: peft_lib.merge_kernel(leaf, *pairs[path], scale) if path in pairs else leaf
  elif config is None:
    weights_dir = None
    not_written = (f"the trained {component.name} ({m.item_dir}) was not written: the run recorded no config of "
                   f"its {m.role} ({m.config_path} is missing) and there is no {component.name}/"
                   f"{component.config_name} to take instead: {no_base}")
  plan = component_export.plan_export(component, weights_dir, config) if weights_dir else None
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
    exported[component.name] = component_export.export_component(component, e.weights_dir, e.config, out,
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


def export_run(params_dir: str, config_path: str, step: int, hf_out_dir: str, source_dir: str | None,
                     max_shard_size, log, merge_lora: bool = False, use_ema: bool = False) -> dict:
  run_dir = os.path.dirname(config_path)
  models = trained_models(params_dir, config_path, use_ema)
  if merge_lora and all(m.lora is None for m in models):
    records = " or ".join(os.path.basename(m.lora_file) for m in models)
    roles = " and ".join(m.role for m in models)
    raise UserError(f"--merge_lora: {run_dir} holds no LoRA adapters (no {records}); its {roles} "
                    f"{'is' if len(models) == 1 else 'are'} exported whole without it")
  source, why_not = training_source(run_dir, source_dir)
  exports = [_plan_model(m, source, why_not, merge_lora) for m in models]
  trained = {m.component.name for m in models}
  others = [n for n in component_export.converted_components(source) if n not in trained] if source is not None else []
  plans = component_export.plan_components(source, others) if source is not None else {}
  # Everything is validated before anything is written.
  for n in (*(e.model.component.name for e in exports if e.weights_dir), *others):
    component_export.fresh_dir(os.path.join(hf_out_dir, n))
  for e in exports:
    if e.adapters is not None:
      component_export.fresh_dir(_adapter_dir(hf_out_dir, e.model.component))
  exported = {}
  for e in exports:
    exported.update(_write_model(e, hf_out_dir, step, max_shard_size, log))
  copied = []
  if source is not None:
    exported.update(component_export.export_components(source, others, hf_out_dir, max_shard_size, log, plans))
    copied = hf_to_flax.copy_pipeline_files(source, hf_out_dir, log)
  reasons = [] if source is not None else [
      f"only {', '.join(exported)} {'was' if len(exported) == 1 else 'were'} written: {why_not}"]
  reasons += [e.not_written for e in exports if e.not_written]
  result = {"exported": exported, "skipped": [], "copied": copied, "step": step, "source": source,
            "incomplete_reason": "; ".join(reasons) or None}
  return component_export.report(result, hf_out_dir, log)
