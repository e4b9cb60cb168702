"""What `--mode=generate` and `--mode=eval` share: the run's parameters restored read-only, and prompt
records sampled in fixed-size batches."""

from __future__ import annotations

import os
from typing import Iterator

import jax
from absl import logging

from glmrl.checkpoint.manager import check_adapters, restore_trained_params, saved_steps
from glmrl.data import PromptIterator
from glmrl.train import setup as setup_lib


def restored_ar_params(run, workdir: str) -> tuple:
  """(the pipeline's `ar_params`, step) of the newest checkpoint in `<workdir>/checkpoints` that restores, or
  of the initial model (step None) without checkpoints. A LoRA run's adapters must be of its base."""
  initial = run.checkpoint_params(run.trainable)
  check_adapters(os.path.join(workdir, "checkpoints"), setup_lib.adapters_record(run), bool(saved_steps(workdir)))
  saved, step = restore_trained_params(workdir, initial)
  if step is None:
    logging.info("no checkpoint in %s: the initial AR model", os.path.join(workdir, "checkpoints"))
    saved = initial
  else:
    logging.info("the AR parameters of step %d", step)
  return run.ar_params(saved), step


def sample_batches(run, records, ar_params) -> Iterator[tuple]:
  """(data batch, pipeline output, real rows) for every `config.data.prompts_per_step` records.

  Each batch draws `group_size` samples per prompt with keys from the fixed `config.eval.seed` (the
  same for every run and checkpoint). A short last batch is filled with the first prompts, so every
  batch has the compiled shape; its first `real` prompts (real x group_size rows) are the records'.
  `ar_params`: the AR parameters as the pipeline takes them, (trainable, frozen) or (full,).
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
    out = run.pipeline(batch.prompts, key, samples_per_prompt=g, source_images=source, ar_params=ar_params)
    yield batch, out, real
