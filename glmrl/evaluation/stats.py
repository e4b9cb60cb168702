"""Means with 95% bootstrap confidence intervals, and paired differences between checkpoints, over prompts.

The unit of resampling is the prompt: the samples of one prompt share it (and, across checkpoints, their seeds),
so they are not independent draws; each prompt's score is the mean of its samples. A bootstrap resample draws
P prompts with replacement; its statistic is the mean of their scores. The interval is the percentile interval
of `RESAMPLES` resamples. Comparisons are paired: every checkpoint is scored on the same prompts with the same
seeds, so the difference of two checkpoints is taken per prompt first, and the same resampled prompt indices
serve every checkpoint and reward (`resample_indices`). A category resamples its own prompts, with its own
indices (seeded by its position in the sorted category names), the same for every checkpoint and reward.
"""

from __future__ import annotations

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


def resample_indices(num_prompts: int, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
  """[resamples, num_prompts] prompt indices drawn with replacement from np.random.default_rng(seed)."""
  return np.random.default_rng(seed).integers(0, num_prompts, size=(resamples, num_prompts))


def per_prompt(scores_PxG) -> np.ndarray:
  """[P] each prompt's mean over its samples (float64)."""
  return np.asarray(scores_PxG, np.float64).mean(axis=1)


def mean_ci(values_P, indices_RxP, level: float = LEVEL) -> dict:
  """{"mean", "low", "high", "n"}: the mean of `values_P` and the percentile bootstrap interval of it over the
  resamples `indices_RxP` (rows of prompt indices into `values_P`). One prompt has no interval: low and high are
  None (its resamples all repeat it, which says nothing about the spread)."""
  values = np.asarray(values_P, np.float64)
  if values.shape[0] < 2:
    return {"mean": float(values.mean()), "low": None, "high": None, "n": int(values.shape[0])}
  boot = values[indices_RxP].mean(axis=1)
  tail = (1.0 - level) / 2.0
  low, high = np.quantile(boot, [tail, 1.0 - tail])
  return {"mean": float(values.mean()), "low": float(low), "high": float(high), "n": int(values.shape[0])}


def paired_difference(values_P, base_P, indices_RxP, level: float = LEVEL) -> dict:
  """`mean_ci` of the per-prompt differences values - base (same prompts, same seeds), plus "excludes_zero":
  whether the interval lies on one side of 0."""
  out = mean_ci(np.asarray(values_P, np.float64) - np.asarray(base_P, np.float64), indices_RxP, level)
  out["excludes_zero"] = out["low"] is not None and bool(out["low"] > 0 or out["high"] < 0)
  return out
