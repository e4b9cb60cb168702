"""`python main.py --mode=generate`: samples of the latest checkpoint (or the initial model) as PNGs.

Models, processors and prompts are built as for training (`glmrl.train.setup.build`); the AR
parameters come from the newest step in `<workdir>/checkpoints` when there is one. Every prompt
of `config.eval.prompts_file` (else `config.data.prompts_file`) gets `config.grpo.group_size`
samples, drawn as `--mode=eval` draws them (`glmrl.train.sample.sample_batches`). Written to `<workdir>/generate/`
(where an earlier generate's samples are, `generate_2/`, `generate_3/`, ...):

- `<prompt index>_<sample>.png`, one per sample (prompt index: line order in the prompt file);
- `grid.png`: one row per prompt, each tile captioned with its prompt;
- `tokens.npz`: `target` [N, h, w] target grids, `tokens` [N, T] all generated tokens and
  `logprobs` [N, T] their sampling log-probs, `prompts` [P], `prompt_index` / `sample_index` [N]
  of each row, and `step` (the restored step, -1 if none).
"""

from __future__ import annotations

import os

import numpy as np
from absl import logging
from PIL import Image

from glmrl.runtime import distributed
from glmrl.logging import make_grid
from glmrl.sharding import to_host
from glmrl.train import setup as setup_lib
from glmrl.train.sample import restored_params, sample_batches


def sample_records(run, records, params: dict) -> dict:
  """group_size samples of every record (`glmrl.train.sample.sample_batches`), fetched to numpy.

  Returns `images` [N, H, W, 3] uint8, `target` [N, h, w], `tokens` and `logprobs` [N, T],
  `prompt_index` and `sample_index` [N] (N = len(records) x group_size, rows of a prompt consecutive).
  """
  g = run.group_size
  parts = {"images": [], "target": [], "tokens": [], "logprobs": []}
  for _, out, real in sample_batches(run, records, params):
    keep = slice(0, real * g)
    parts["images"].append(to_host(out.images)[keep])
    parts["target"].append(to_host(out.sample.target)[keep])
    parts["tokens"].append(to_host(out.sample.tokens)[keep])
    parts["logprobs"].append(to_host(out.sample.logprobs)[keep])
  result = {k: np.concatenate(v) for k, v in parts.items()}
  result["prompt_index"] = np.repeat(np.arange(len(records)), g)
  result["sample_index"] = np.tile(np.arange(g), len(records))
  return result


def write_outputs(out_dir: str, samples: dict, prompts, group_size: int, step: int | None) -> dict:
  """Per-sample PNGs, the captioned grid and tokens.npz; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  pngs = []
  for image, p, s in zip(samples["images"], samples["prompt_index"], samples["sample_index"]):
    path = os.path.join(out_dir, f"{p}_{s}.png")
    Image.fromarray(image).save(path)
    pngs.append(path)
  captions = [prompts[p] for p in samples["prompt_index"]]
  grid_path = os.path.join(out_dir, "grid.png")
  Image.fromarray(make_grid(samples["images"], captions, ncols=group_size)).save(grid_path)
  tokens_path = os.path.join(out_dir, "tokens.npz")
  np.savez(tokens_path, target=samples["target"], tokens=samples["tokens"], logprobs=samples["logprobs"],
           prompts=np.asarray(prompts, dtype=str),
           prompt_index=samples["prompt_index"], sample_index=samples["sample_index"],
           step=np.int64(-1 if step is None else step))
  return {"pngs": pngs, "grid": grid_path, "tokens": tokens_path}


def output_folder(workdir: str) -> str:
  """`<workdir>/generate`, or where an earlier generate's samples are there the first free `generate_<k>` (k = 2,
  3, ...): a generate never replaces another's."""
  folder, k = os.path.join(workdir, "generate"), 1
  while os.path.isdir(folder) and os.listdir(folder):
    k += 1
    folder = os.path.join(workdir, f"generate_{k}")
  return folder


def generate(config, workdir: str, use_ema: bool = False) -> dict:
  """Samples every prompt and writes the results to `<workdir>/generate`; returns the written paths
  and the restored checkpoint step (None when there was no checkpoint). `use_ema`: see `restored_params`."""
  run = setup_lib.build(config)
  records = run.eval_records or run.records
  params, step = restored_params(run, workdir, use_ema)
  samples = sample_records(run, records, params)
  if not distributed.is_main():  # every process sampled its shards; process 0 writes
    return {"step": step}
  paths = write_outputs(output_folder(workdir), samples, [r.prompt for r in records], run.group_size, step)
  logging.info("wrote %d images, %s and %s", len(paths["pngs"]), paths["grid"], paths["tokens"])
  return {**paths, "step": step}
