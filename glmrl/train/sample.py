"""What `--mode=generate` and `--mode=eval` share: the run's parameters restored read-only, and prompt
records sampled in fixed-size batches."""

from __future__ import annotations

import os
from typing import Iterator

import jax
from absl import logging

from glmrl.checkpoint.adapters import check_adapters
from glmrl.checkpoint.manager import restore_trained_params, saved_steps
from glmrl.data import PromptIterator


def restored_params(run, workdir: str, use_ema: bool = False, step: int | None = None) -> tuple[dict, int | None]:
  """(the pipeline's parameters to sample with: `ar_params` and `dit_params`, step) of the newest checkpoint in
  `<workdir>/checkpoints` that restores, or of the initial models (step None) without checkpoints. A LoRA
  policy's adapters must be of its base. What the run does not train (the AR generator of a decoder-only run,
  the DiT of an AR run) is as built. `use_ema`: a policy that keeps a moving average is restored from it.
  `step`: that checkpoint, not the newest."""
  directory = os.path.join(workdir, "checkpoints")
  has_steps = bool(saved_steps(workdir))
  items = {}
  for name, state in run.states.items():
    saved = state.policy.saved
    check_adapters(directory, state.adapters_record(), has_steps, saved.adapters_file, saved.lora_section)
    averaged = use_ema and state.policy.settings.ema.enabled
    items[name] = (saved.ema if averaged else saved.params, state)
  # One step for every policy: the newest whose every item restores (in every process).
  restored, step = restore_trained_params(workdir, {item: state.checkpoint_params() for item, state in items.values()},
                                          step)
  trainables = {name: state.trainable if restored is None else state.trainable_of(restored[item])
                for name, (item, state) in items.items()}
  if step is None:
    logging.info("no checkpoint in %s: the initial models", directory)
  else:
    logging.info("the trained parameters%s of step %d (%s)", " (their moving average)" if use_ema else "", step,
                 ", ".join(item for item, _ in items.values()))
  return run.sampling_params(trainables), step


def sample_batches(run, records, params: dict) -> Iterator[tuple]:
  """(data batch, pipeline output, real rows) for every `config.data.prompts_per_step` records.

  Each batch draws `group_size` samples per prompt with keys from the fixed `config.eval.seed` (the
  same for every run and checkpoint). A short last batch is filled with the first prompts, so every
  batch has the compiled shape; its first `real` prompts (real x group_size rows) are the records'.
  `params`: what the pipeline samples with (`Run.sampling_params`).
  """
  cfg, g = run.config, run.group_size
  per_batch = cfg.data.prompts_per_step
  loader = PromptIterator(records, prompts_per_step=per_batch, seed=cfg.eval.seed, height=cfg.data.height,
                          width=cfg.data.width)
  for start in range(0, len(records), per_batch):
    indices = list(range(start, min(start + per_batch, len(records))))
    real = len(indices)
    indices += [i % len(records) for i in range(per_batch - real)]
    batch = loader.make_batch(indices)
    source = batch.source_images if cfg.data.mode == "i2i" else None
    key = jax.random.fold_in(jax.random.key(cfg.eval.seed), start)
    out = run.pipeline(batch.prompts, key, samples_per_prompt=g, source_images=source, **params)
    yield batch, out, real
