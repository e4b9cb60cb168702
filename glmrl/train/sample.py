"""What `--mode=generate` and `--mode=eval` share: the run's parameters restored read-only, and prompt
records sampled in fixed-size batches."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator

import jax
from absl import logging

from glmrl.checkpoint.manager import (DECODER_LORA_FILE, DECODER_PARAMS, check_adapters, restore_trained_params,
                                     saved_steps)
from glmrl.data import PromptIterator
from glmrl.train import setup as setup_lib


@dataclasses.dataclass(frozen=True)
class Policies:
  """The parameters the pipeline samples with: `ar` its `ar_params` ((trainable, frozen) or (full,)), `dit`
  its `dit_params` (None: the pipeline's own DiT, as released)."""
  ar: tuple
  dit: object = None

  @classmethod
  def of_run(cls, run, ar_trainable, dit_trainable=None) -> "Policies":
    """A run's sampling parameters for its current trained states."""
    return cls((ar_trainable, run.frozen),
               None if run.decoder is None else run.decoder.dit_params(dit_trainable))


def restored_params(run, workdir: str) -> tuple[Policies, int | None]:
  """(the parameters to sample with, step) of the newest checkpoint in `<workdir>/checkpoints` that restores,
  or of the initial models (step None) without checkpoints. A LoRA run's adapters must be of its base.
  What the run does not train (the AR generator of a decoder-only run, the DiT of an AR run) is as built."""
  directory = os.path.join(workdir, "checkpoints")
  has_steps = bool(saved_steps(workdir))
  initial = run.checkpoint_params(run.trainable)
  ar, dit, step = run.ar_params(initial), None, None
  if "ar" in run.policies:
    check_adapters(directory, setup_lib.adapters_record(run), has_steps)
    saved, step = restore_trained_params(workdir, initial)
    if saved is not None:
      ar = run.ar_params(saved)
  if run.decoder is not None:
    check_adapters(directory, setup_lib.decoder_adapters_record(run), has_steps, DECODER_LORA_FILE)
    saved, dit_step = restore_trained_params(workdir, run.decoder.trainable, DECODER_PARAMS)
    dit = run.decoder.dit_params(run.decoder.trainable if saved is None else saved)
    step = dit_step if step is None else step
  if step is None:
    logging.info("no checkpoint in %s: the initial models", directory)
  else:
    logging.info("the trained parameters of step %d", step)
  return Policies(ar, dit), step


def sample_batches(run, records, params: Policies) -> Iterator[tuple]:
  """(data batch, pipeline output, real rows) for every `config.data.prompts_per_step` records.

  Each batch draws `group_size` samples per prompt with keys from the fixed `config.eval.seed` (the
  same for every run and checkpoint). A short last batch is filled with the first prompts, so every
  batch has the compiled shape; its first `real` prompts (real x group_size rows) are the records'.
  `params`: what the pipeline samples with.
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
    out = run.pipeline(batch.prompts, key, samples_per_prompt=g, source_images=source, ar_params=params.ar,
                       dit_params=params.dit)
    yield batch, out, real
