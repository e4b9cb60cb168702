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

import errno
import os
import shutil
import tempfile
from typing import Callable

from checkpoints_convert import component_export
from checkpoints_convert import components as components_lib
from checkpoints_convert import hf_to_flax
from checkpoints_convert import run_export
from checkpoints_convert import safetensors_stream as st
from checkpoints_convert.component_export import DEFAULT_MAX_SHARD_SIZE
from glmrl.errors import UserError

__all__ = ["DEFAULT_MAX_SHARD_SIZE", "export"]


def export(ckpt_dir: str, hf_out_dir: str, *, step: int | None = None, source_dir: str | None = None,
           max_shard_size=DEFAULT_MAX_SHARD_SIZE, merge_lora: bool = False, use_ema: bool = False,
           overwrite: bool = False, log: Callable[[str], None] = print) -> dict:
  """`_export` into `hf_out_dir` as one step: written into a hidden folder beside it and renamed into place once
  complete, so a failed or interrupted export leaves nothing there (and nothing that blocks a retry). A non-empty
  `hf_out_dir` is refused unless `overwrite` (then replaced whole, once the new folder is complete); a folder
  inside what is read, or holding it, always; with `overwrite`, a folder inside a training run's workdir (its
  samples, its logs). A link is followed: the export lands where it points, the link stays. A full disk is one
  error naming the folder and the space."""
  if not os.path.isdir(ckpt_dir):
    raise UserError(f"--ckpt_dir {ckpt_dir!r} is not a directory")
  shown = os.path.abspath(hf_out_dir)
  out = os.path.realpath(hf_out_dir)
  named = f"--hf_out_dir={hf_out_dir}" + (f" (a link to {out})" if out != shown else "")
  for flag, read in (("--ckpt_dir", ckpt_dir), ("--source_dir", source_dir)):
    if read and _holds(out, os.path.realpath(read)):
      raise UserError(f"{named} is or holds {flag}={read}, which the export reads: choose another folder")
  if os.path.exists(out) and not os.path.isdir(out):
    raise UserError(f"{named} is a file")
  entries = sorted(os.listdir(out)) if os.path.isdir(out) else []
  if entries and not overwrite:
    raise UserError(f"{named} is not empty ({len(entries)} entries, e.g. {entries[0]!r}): choose "
                    "a new or empty folder, or pass --overwrite to replace it")
  workdir = run_export.training_workdir(ckpt_dir)
  if entries and workdir and _holds(os.path.realpath(workdir), out):
    raise UserError(f"{named} is inside the training run's workdir {workdir}: --overwrite would replace what the "
                    "run wrote; export into a new folder")
  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  free = shutil.disk_usage(parent).free
  partial = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.partial-", dir=parent)
  try:
    result = _export(ckpt_dir, partial, step=step, source_dir=source_dir, max_shard_size=max_shard_size,
                     merge_lora=merge_lora, use_ema=use_ema, log=lambda line: log(line.replace(partial, shown)))
    _move_into_place(partial, out)
  except OSError as e:
    if e.errno != errno.ENOSPC:
      raise
    written = _size(partial)
    raise UserError(f"{named}: its disk filled after {written / 2**20:.1f} MiB of the export "
                    f"({free / 2**20:.1f} MiB were free; it needs more): free space there or choose another folder "
                    "(nothing was left behind)") from None
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  return _renamed(result, partial, shown)


def _move_into_place(partial: str, out: str) -> None:
  """Renames the complete `partial` to `out`, an older `out` set aside first and removed after; should the second
  rename fail the older folder is put back, so `out` is always either the old export or the new one."""
  if not os.path.isdir(out):
    os.rename(partial, out)
    return
  replaced = f"{partial}.replaced"
  os.rename(out, replaced)
  try:
    os.rename(partial, out)
  except BaseException:
    os.rename(replaced, out)
    raise
  shutil.rmtree(replaced, ignore_errors=True)


def _holds(folder: str, path: str) -> bool:
  """Whether `path` is `folder` or inside it (both absolute)."""
  return os.path.commonpath([folder, path]) == folder


def _size(folder: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def _renamed(tree, old: str, new: str):
  """`tree` with every string's `old` path replaced by `new` (the report's paths, written under the partial folder)."""
  if isinstance(tree, str):
    return tree.replace(old, new)
  if isinstance(tree, dict):
    return {k: _renamed(v, old, new) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return type(tree)(_renamed(v, old, new) for v in tree)
  return tree


def _export(ckpt_dir: str, hf_out_dir: str, *, step: int | None, source_dir: str | None, max_shard_size,
            merge_lora: bool, use_ema: bool, log: Callable[[str], None]) -> dict:
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
  st.parse_size(max_shard_size)
  training = run_export.find_training_checkpoint(ckpt_dir, step)
  if training is not None:
    return run_export.export_run(*training, hf_out_dir, source_dir, max_shard_size, log, merge_lora, use_ema)
  if use_ema:
    raise UserError(f"--use_ema is for a training run whose decoder kept a moving average; {ckpt_dir} is not a "
                    "training checkpoint")
  if merge_lora:
    raise UserError(f"--merge_lora is for a LoRA training run; {ckpt_dir} is not a training checkpoint")
  if step is not None:
    raise UserError(f"--step given but {ckpt_dir} is not a training checkpoint "
                    f"(no {run_export.TRAINING_CONFIG} in it or in its checkpoints/)")
  if source_dir is not None:
    raise UserError(f"--source_dir is for a training checkpoint; {ckpt_dir} is not one "
                    f"(no {run_export.TRAINING_CONFIG} in it or in its checkpoints/): its own components are exported")
  present = component_export.converted_components(ckpt_dir)
  if not present:
    raise UserError(f"{ckpt_dir}: neither a converted checkpoint (<component>/params/) "
                    f"nor a training checkpoint ({run_export.TRAINING_CONFIG})")
  skipped = [n for n in components_lib.COMPONENTS if n not in present]
  plans = component_export.plan_components(ckpt_dir, present)
  for n in present:
    component_export.fresh_dir(os.path.join(hf_out_dir, n))
  for n in skipped:
    log(f"skipped {n}: not in {ckpt_dir}")
  exported = component_export.export_components(ckpt_dir, present, hf_out_dir, max_shard_size, log, plans)
  copied = hf_to_flax.copy_pipeline_files(ckpt_dir, hf_out_dir, log)
  return component_export.report({"exported": exported, "skipped": skipped, "copied": copied, "incomplete_reason": None},
                 hf_out_dir, log)
