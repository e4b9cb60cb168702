"""`python main.py --mode=eval` and the training loop's periodic evaluation: held-out prompts with
fixed seeds, scored as training scores (`RewardComposer.score`), logged under `eval/`."""

from __future__ import annotations

import os

import numpy as np
from absl import logging

from glmrl.logging import run_writer
from glmrl.sharding import to_host
from glmrl.train import setup as setup_lib
from glmrl.train.rollout import host_metadata
from glmrl.train.sample import restored_params, sample_batches


def run_eval(run, params: dict, writer, step: int) -> dict:
  """Samples group_size images per held-out prompt with the fixed eval seed (the ODE, sampling.dit_steps)
  and logs their rewards: the AR policy's under eval/reward/, the decoder policy's under
  eval/decoder/reward/ when it trains."""
  g = run.group_size
  records = run.eval_records
  if not records:
    raise ValueError("evaluation needs config.eval.prompts_file")
  # config.rewards under eval/reward/; every other trained policy's own rewards under eval/<its prefix>.
  composers = {"": run.composer}
  composers.update({run.policies[name].prefix(tuple(run.policies)): c for name, c in run.composers.items()
                    if c is not run.composer})
  totals, components, images_out, prompts_out = {k: [] for k in composers}, {}, None, None
  for batch, out, real in sample_batches(run, records, params):
    prompts = [p for p in batch.prompts for _ in range(g)]
    keep = slice(0, real * g)
    for prefix, composer in composers.items():
      total, comps = composer.score(out.images, prompts, host_metadata(batch.metadata, g))
      totals[prefix].append(to_host(total)[keep])
      for k, v in comps.items():
        components.setdefault(f"{prefix}reward/{k}", []).append(to_host(v)[keep])
    if images_out is None:
      images_out, prompts_out = to_host(out.images)[keep], prompts[:real * g]
  scalars = {}
  for prefix, parts in totals.items():
    every = np.concatenate(parts)
    scalars.update({f"eval/{prefix}reward/mean": float(every.mean()), f"eval/{prefix}reward/std": float(every.std())})
  for k, v in components.items():
    scalars[f"eval/{k}/mean"] = float(np.concatenate(v).mean())
  total = np.concatenate(totals[""])
  writer.write_scalars(step, scalars)
  writer.write_samples(step, images_out, prompts_out, total[:len(prompts_out)], tag="eval_samples", ncols=g)
  logging.info("eval at step %d: reward %.4f", step, scalars["eval/reward/mean"])
  return scalars


def evaluate(config, workdir: str, use_ema: bool = False) -> dict:
  """`--mode=eval`: the newest restorable checkpoint in workdir (or the initial model) on the held-out
  prompts, logged at its step (0 for the initial model). Read-only on the checkpoints. `use_ema`: see
  `restored_params`."""
  run = setup_lib.build(config)
  params, step = restored_params(run, workdir, use_ema)
  os.makedirs(workdir, exist_ok=True)
  writer = run_writer(workdir)
  try:
    return run_eval(run, params, writer, step or 0)
  finally:
    writer.close()
