"""`python main.py --mode=eval` and the training loop's periodic evaluation: held-out prompts with
fixed seeds, scored as training scores (`RewardComposer.score`), logged under `eval/`; with config.eval.steps,
checkpoints compared on them with confidence intervals (`glmrl.evaluation`)."""

from __future__ import annotations

import os

import jax
import numpy as np
from absl import logging
from PIL import Image

from glmrl.runtime import distributed
from glmrl.checkpoint.atomic import write_json_atomic, write_text_atomic
from glmrl.checkpoint.manager import saved_steps
from glmrl.errors import UserError
from glmrl.evaluation import drift
from glmrl.evaluation import page
from glmrl.evaluation import report as report_lib
from glmrl.evaluation import stats
from glmrl.logging import run_writer
from glmrl.sharding import to_host
from glmrl.train import setup as setup_lib
from glmrl.train.rollout import host_metadata
from glmrl.train.sample import restored_params, sample_batches


def score(run, params: dict, first_samples_dir: str | None = None,
          thumbnails: list | None = None) -> tuple[dict, np.ndarray, list]:
  """Samples group_size images per held-out prompt with the fixed eval seed (the ODE, sampling.dit_steps) and
  scores them: ({reward name: [R * group_size] scores, prompt-major}, the first batch's images and prompts). The
  names are the logged ones without `eval/`: config.rewards' total `reward` and components `reward/<name>`, and
  every other trained policy's own rewards under its prefix (`decoder/reward`, ...). `first_samples_dir`: each
  prompt's first sample is written there as `<prompt index>.png` (the comparison page's images). `thumbnails`: a list
  every batch's images are appended to, reduced for the drift (`glmrl.evaluation.drift.thumbnails`)."""
  g = run.group_size
  records = run.eval_records
  if not records:
    raise ValueError("evaluation needs config.eval.prompts_file or config.eval.benchmark")
  composers = {"": run.composer}
  composers.update({run.policies[name].prefix(tuple(run.policies)): c for name, c in run.composers.items()
                    if c is not run.composer})
  scores, images_out, prompts_out = {}, None, None
  if first_samples_dir:
    os.makedirs(first_samples_dir, exist_ok=True)
  done = 0
  for batch, out, real in sample_batches(run, records, params):
    prompts = [p for p in batch.prompts for _ in range(g)]
    keep = slice(0, real * g)
    for prefix, composer in composers.items():
      total, comps = composer.score(out.images, prompts, host_metadata(batch.metadata, g))
      scores.setdefault(f"{prefix}reward", []).append(to_host(total)[keep])
      for k, v in comps.items():
        scores.setdefault(f"{prefix}reward/{k}", []).append(to_host(v)[keep])
    host = None
    if images_out is None:
      host = to_host(out.images)[keep]
      images_out, prompts_out = host, prompts[:real * g]
    if first_samples_dir or thumbnails is not None:
      host = to_host(out.images)[keep] if host is None else host
    if first_samples_dir:
      for i, image in enumerate(host[::g]):
        Image.fromarray(image).save(os.path.join(first_samples_dir, f"{done + i}.png"))
    if thumbnails is not None:
      thumbnails.append(drift.thumbnails(host))
    done += real
  return {k: np.concatenate(v) for k, v in scores.items()}, images_out, prompts_out


def log_scores(writer, step: int, scores: dict, images, prompts, group_size: int, seed: int) -> dict:
  """The scalars of `score`'s output under eval/: each component's mean, each total's mean, std and 95% bootstrap
  interval over prompts (`ci_low`, `ci_high`; `glmrl.evaluation.stats`, resamples seeded by `seed`); and the
  first batch's grid."""
  scalars = {}
  for name, values in scores.items():
    scalars[f"eval/{name}/mean"] = float(values.mean())
    if name == "reward" or name.endswith("/reward") or name.startswith("drift/"):  # its spread and interval too
      scalars[f"eval/{name}/std"] = float(values.std())
      per_prompt = stats.per_prompt(values.reshape(-1, group_size))
      ci = stats.mean_ci(per_prompt, stats.resample_indices(per_prompt.shape[0], seed))
      if ci["low"] is not None:
        scalars[f"eval/{name}/ci_low"], scalars[f"eval/{name}/ci_high"] = ci["low"], ci["high"]
  writer.write_scalars(step, scalars)
  writer.write_samples(step, images, prompts, scores["reward"][:len(prompts)], tag="eval_samples", ncols=group_size)
  return scalars


def replace_eval_rows(writer, steps) -> None:
  """Drops the metrics.jsonl rows of an earlier evaluation at `steps` (rows of eval/ scalars alone): the one about
  to be logged replaces them, so a repeated or interrupted eval leaves each step's rows once."""
  steps = set(steps)
  writer.drop_rows(lambda row: row["step"] in steps and all(k == "step" or k.startswith("eval/") for k in row))


def run_eval(run, params: dict, writer, step: int) -> dict:
  """`score` and `log_scores` at `step`: the AR policy's rewards under eval/reward/, the decoder policy's under
  eval/decoder/reward/ when it trains."""
  scores, images, prompts = score(run, params)
  scalars = log_scores(writer, step, scores, images, prompts, run.group_size, run.config.eval.seed)
  logging.info("eval at step %d: reward %.4f", step, scalars["eval/reward/mean"])
  return scalars


def check_steps(config, workdir: str) -> list[int]:
  """config.eval.steps as a list (empty: the newest checkpoint alone); each step > 0 must have a checkpoint in
  the workdir (checked before any model is built)."""
  steps = report_lib.parse_steps(config.eval.steps)
  saved = saved_steps(workdir)
  missing = [s for s in steps if s and s not in saved]
  if missing:
    raise UserError(f"config.eval.steps={config.eval.steps!r}: no checkpoint of step {missing[0]} in "
                    f"{os.path.join(workdir, 'checkpoints')} (saved: {saved or 'none'})")
  return steps


def compare(run, workdir: str, steps: list[int], use_ema: bool = False) -> dict:
  """Every checkpoint of `steps` (0: the initial models, adapters off) on the same prompts with the same seeds,
  each image's distance to the first step's image of its prompt and seed beside the rewards (`drift/...`,
  `glmrl.evaluation.drift`); writes <workdir>/eval/report.json, report.md (`glmrl.evaluation.report`) and index.html (`glmrl.evaluation.page`:
  each prompt's first sample at every checkpoint, under eval/images/<step>/) and each step's scalars and grid.
  Returns the report."""
  cfg = run.config
  scores, base_thumbs = {}, None
  lpips = drift_lpips(cfg.eval.drift_lpips_dir)
  writer = run_writer(workdir, cfg, job="eval")
  try:
    replace_eval_rows(writer, steps)
    for step in steps:
      params = run.sampling_params() if step == 0 else restored_params(run, workdir, use_ema, step)[0]
      # Process 0 writes the page's images and the reports (every process samples its shards).
      first = os.path.join(workdir, "eval", "images", str(step)) if distributed.is_main() else None
      thumbs = []
      per_image, images, prompts = score(run, params, first, thumbs)
      # How far each image moved from the first listed checkpoint's at the same prompt and seed.
      thumbs = np.concatenate(thumbs)
      base_thumbs = thumbs if base_thumbs is None else base_thumbs
      per_image.update(drift.distances(thumbs, base_thumbs, lpips))
      log_scores(writer, step, per_image, images, prompts, run.group_size, cfg.eval.seed)
      scores[step] = {k: v.reshape(-1, run.group_size) for k, v in per_image.items()}
      logging.info("eval of %s: reward %.4f", f"step {step}" if step else "the initial models",
                   float(per_image["reward"].mean()))
  finally:
    writer.close()
  categories = [str(r.metadata.get("category", "all")) for r in run.eval_records]
  result = report_lib.compare(scores, categories, cfg.eval.seed, prompts=[r.prompt for r in run.eval_records])
  if not distributed.is_main():
    return result
  out_dir = os.path.join(workdir, "eval")
  os.makedirs(out_dir, exist_ok=True)
  write_json_atomic(os.path.join(out_dir, "report.json"), result)
  source = cfg.eval.benchmark or cfg.eval.prompts_file
  title = f"{source}: steps {', '.join(map(str, steps))}"
  write_text_atomic(os.path.join(out_dir, "report.md"), report_lib.markdown(result, title) + "\n")
  write_text_atomic(os.path.join(out_dir, "index.html"), page.html(result, title, image_dir="images"))
  logging.info("wrote %s, report.md and index.html", os.path.join(out_dir, "report.json"))
  return result


def drift_lpips(weights_dir: str):
  """LPIPS of two uint8 batches ([B] distances) from converted weights, or None without a folder."""
  if not weights_dir:
    return None
  from glmrl.models.lpips import load_lpips  # pylint: disable=import-outside-toplevel  # only when asked for

  model = load_lpips(os.path.abspath(weights_dir))
  return lambda a, b: np.asarray(jax.device_get(model(jax.numpy.asarray(a), jax.numpy.asarray(b))))


def evaluate(config, workdir: str, use_ema: bool = False) -> dict:
  """`--mode=eval`: the newest restorable checkpoint in workdir (or the initial model) on the held-out
  prompts, logged at its step (0 for the initial model); with config.eval.steps, those checkpoints compared
  (`compare`). Read-only on the checkpoints. `use_ema`: see `restored_params`."""
  steps = check_steps(config, workdir)
  run = setup_lib.build(config, logs=True)
  if steps:
    return compare(run, workdir, steps, use_ema)
  params, step = restored_params(run, workdir, use_ema)
  os.makedirs(workdir, exist_ok=True)
  writer = run_writer(workdir, run.config, job="eval")
  try:
    replace_eval_rows(writer, [step or 0])
    return run_eval(run, params, writer, step or 0)
  finally:
    writer.close()
