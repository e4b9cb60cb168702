"""Evaluation on held-out prompts with fixed seeds, logged under `eval/`."""

from __future__ import annotations

import jax
import numpy as np
from absl import logging

from glmrl.data import PromptIterator
from glmrl.train import rollout as rollout_lib


def run_eval(run, params, writer, step: int) -> dict:
  """Samples group_size images per held-out prompt with the fixed eval seed and logs their rewards."""
  cfg, g = run.config, run.group_size
  records = run.eval_records
  if not records:
    raise ValueError("evaluation needs config.eval.prompts_file")
  per_batch = cfg.data.prompts_per_step
  loader = PromptIterator(records, prompts_per_step=per_batch, seed=cfg.eval.seed, height=cfg.data.height,
                          width=cfg.data.width)
  totals, components, images_out, prompts_out = [], {}, None, None
  for start in range(0, len(records), per_batch):
    indices = list(range(start, min(start + per_batch, len(records))))
    real = len(indices)
    # A short last batch is filled with the first prompts, so every batch has the compiled shape.
    indices += [i % len(records) for i in range(per_batch - real)]
    batch = loader.make_batch(indices)
    key = jax.random.fold_in(jax.random.key(cfg.eval.seed), start)
    source = batch.source_images if cfg.data.mode == "i2i" else None
    out = run.pipeline(batch.prompts, key, samples_per_prompt=g, source_images=source,
                       ar_params=(params, run.frozen))
    prompts = [p for p in batch.prompts for _ in range(g)]
    total, comps = run.composer(out.images, prompts, rollout_lib.host_metadata(batch.metadata, g))
    keep = slice(0, real * g)
    totals.append(total[keep])
    for k, v in comps.items():
      components.setdefault(k, []).append(v[keep])
    if images_out is None:
      images_out, prompts_out = np.asarray(out.images)[keep], prompts[:real * g]
  total = np.concatenate(totals)
  scalars = {"eval/reward/mean": float(total.mean()), "eval/reward/std": float(total.std())}
  for k, v in components.items():
    scalars[f"eval/reward/{k}/mean"] = float(np.concatenate(v).mean())
  writer.write_scalars(step, scalars)
  writer.write_samples(step, images_out, prompts_out, total[:len(prompts_out)], tag="eval_samples", ncols=g)
  logging.info("eval at step %d: reward %.4f", step, scalars["eval/reward/mean"])
  return scalars


def evaluate(config, workdir: str) -> dict:
  """`--mode=eval`: the latest checkpoint in workdir (or the initial model) on the held-out prompts."""
  from glmrl.train.loop import Trainer

  trainer = Trainer(config, workdir)
  try:
    return run_eval(trainer.run, trainer.params, trainer.writer, trainer.step_index)
  finally:
    trainer.close()
