"""Per-step metrics to tensorboard, `metrics.jsonl`, the console and optionally W&B; sample grids to PNG."""

import json
import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from absl import logging
from PIL import Image

from glmrl.logging.images import make_grid
from glmrl.logging.tensorboard import Events


def _to_float(key: str, value: Any) -> float:
  try:
    arr = np.asarray(value)
  except Exception as e:  # noqa: BLE001  (anything not array-like)
    raise ValueError(f"metric {key!r}: value {value!r} is not a number") from e
  if arr.size != 1 or arr.dtype.kind not in "biuf":
    raise ValueError(f"metric {key!r}: value must be a real scalar, got {arr.dtype} {arr.shape}")
  return float(arr.reshape(()))


def _check_step(step: Any) -> int:
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
    raise ValueError(f"step={step!r} must be a non-negative integer")
  return int(step)


def sample_captions(prompts: Sequence[str], rewards) -> list[str]:
  """'<reward> | <prompt>' per sample."""
  rewards = np.asarray(rewards, np.float64).reshape(-1)
  if len(prompts) != rewards.size:
    raise ValueError(f"got {len(prompts)} prompts for {rewards.size} rewards")
  return [f"{r:.4g} | {p}" for p, r in zip(prompts, rewards)]


class MetricsWriter:
  """Writes scalars and sample grids for a run directory `workdir`.

  `<workdir>/metrics.jsonl` gets one object per `write_scalars` call, e.g.
  `{"step": 3, "reward/mean": 0.41}`; non-finite values are written as null.
  Tensorboard event files go to `workdir`, sample grids to `<workdir>/samples/`; with `wandb` (a
  `glmrl.logging.wandb_run.WandbRun`) the same scalars and grids go to W&B too.
  """

  def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True, wandb=None):
    self.workdir = os.fspath(workdir)
    self.samples_dir = os.path.join(self.workdir, "samples")
    self.metrics_path = os.path.join(self.workdir, "metrics.jsonl")
    os.makedirs(self.samples_dir, exist_ok=True)
    self._jsonl = open(self.metrics_path, "a", encoding="utf-8")
    self._tb = Events(self.workdir) if tensorboard else None
    self._wandb = wandb

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> dict[str, float | None]:
    """Logs floats-convertible scalars for `step`; returns the row written to metrics.jsonl."""
    step = _check_step(step)
    values = {}
    for key, value in scalars.items():
      if not isinstance(key, str) or not key or key == "step":
        raise ValueError(f"metric key {key!r} must be a non-empty string other than 'step'")
      values[key] = _to_float(key, value)
    row = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in sorted(values.items())}}
    self._jsonl.write(json.dumps(row, allow_nan=False) + "\n")
    self._jsonl.flush()  # a crashed run keeps every completed step
    # Non-finite values stay out of TensorBoard and W&B; metrics.jsonl and the console keep them.
    finite = {k: v for k, v in values.items() if math.isfinite(v)}
    if self._tb is not None:
      for key, value in finite.items():
        self._tb.add_scalar(key, value, step)
    if self._wandb is not None:
      self._wandb.add_scalars(step, finite)
    # The console shows a short progress line (glmrl.logging.progress); every value is here at debug level.
    logging.debug("step %d | %s", step, " | ".join(f"{k} {v:.4g}" for k, v in sorted(values.items())))
    return row

  def drop_rows_after(self, step: int) -> int:
    """Removes the rows of steps after `step` (a resumed run redoes them); returns how many."""
    step = _check_step(step)
    return self.drop_rows(lambda row: row["step"] > step)

  def drop_rows(self, drop: Callable[[dict], bool]) -> int:
    """Removes the rows `drop` is true of (rows written again replace them); returns how many.

    The file is rewritten to a temporary name and renamed over the old one, so an interruption
    leaves either the old or the new file.
    """
    self._jsonl.flush()
    with open(self.metrics_path, encoding="utf-8") as f:
      lines = f.read().splitlines()
    keep = [line for line in lines if line.strip() and not drop(json.loads(line))]
    dropped = len([line for line in lines if line.strip()]) - len(keep)
    if dropped:
      self._jsonl.close()
      tmp = self.metrics_path + ".tmp"
      with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in keep))
      os.replace(tmp, self.metrics_path)
      self._jsonl = open(self.metrics_path, "a", encoding="utf-8")
    return dropped

  def write_images(self, step: int, images_uint8, captions: Sequence[str] | None = None, *,
                   tag: str = "samples", ncols: int | None = None) -> str:
    """Writes a captioned grid to tensorboard and `<workdir>/samples/<tag>_<step>.png`; returns the path."""
    step = _check_step(step)
    if not isinstance(tag, str) or not tag:
      raise ValueError(f"tag={tag!r} must be a non-empty string")
    grid = make_grid(images_uint8, captions, ncols)
    if self._tb is not None:
      self._tb.add_image(tag, grid, step)
    if self._wandb is not None:
      self._wandb.add_image(tag, grid, step)
    safe_tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", tag)
    path = os.path.join(self.samples_dir, f"{safe_tag}_{step:08d}.png")
    Image.fromarray(grid).save(path, format="PNG")
    return path

  def write_samples(self, step: int, images_uint8, prompts: Sequence[str], rewards, *,
                    tag: str = "samples", ncols: int | None = None) -> str:
    """`write_images` with '<reward> | <prompt>' captions."""
    return self.write_images(step, images_uint8, sample_captions(prompts, rewards), tag=tag, ncols=ncols)

  def flush(self) -> None:
    self._jsonl.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if not self._jsonl.closed:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.close()
      self._wandb = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class NullWriter:
  """A MetricsWriter that writes nothing: the processes of a multi-process run other than process 0."""

  def write_scalars(self, step, scalars):
    return {"step": step, **scalars}

  def drop_rows_after(self, step) -> int:
    return 0

  def drop_rows(self, drop) -> int:
    return 0

  def write_images(self, *args, **kwargs):
    return None

  def write_samples(self, *args, **kwargs):
    return None

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass


def run_writer(workdir, config=None, job: str = "train"):
  """The run's writer: a MetricsWriter on process 0 (also logging to W&B when `config.log.wandb`, as a run of job
  type `job`), a NullWriter on the others."""
  from glmrl.runtime import distributed  # pylint: disable=import-outside-toplevel  (jax: only once a writer is made)

  if not distributed.is_main():
    return NullWriter()
  wandb = None
  if config is not None and config.log.wandb:
    from glmrl.logging.wandb_run import WandbRun

    wandb = WandbRun(workdir, project=config.log.wandb_project, name=config.log.wandb_name,
                     mode=config.log.wandb_mode, job=job, config=config.to_dict())
  return MetricsWriter(workdir, wandb=wandb)
