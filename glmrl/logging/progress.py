"""The console view of a run: a short progress line per step, and a closing summary.

Every metric still goes to metrics.jsonl and TensorBoard; the console shows the few a person
watches (reward, loss, ratio range, KL, step time) with the elapsed time and an ETA.
"""

from __future__ import annotations

import datetime
import math
import sys
import time
from typing import Mapping

# (metric key, label, format) in the order shown; missing or non-finite ones are skipped.
SHOWN = (
    ("reward/mean", "reward", "{:.4g}"),
    ("loss", "loss", "{:.3g}"),
    ("kl", "kl", "{:.3g}"),
    ("grad_norm", "grad", "{:.3g}"),
)


POLICY_PREFIXES = ("", "ar/", "decoder/")


def console(line: str, elsewhere: str | None = None) -> None:
  """A line for the person watching (stderr, process 0 alone), without the log prefix of absl's records;
  `elsewhere`: the line of the other processes of a run (that each is alive and where), if any."""
  from glmrl.runtime import distributed  # pylint: disable=import-outside-toplevel  (jax: only once a line is printed)

  if distributed.is_main():
    print(line, file=sys.stderr, flush=True)
  elif elsewhere:
    print(elsewhere, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
  return str(datetime.timedelta(seconds=int(round(seconds))))


class Progress:
  """Formats `step i/N` lines for steps `start_step + 1 .. num_steps` of this process."""

  def __init__(self, num_steps: int, start_step: int = 0, now=time.monotonic):
    self.num_steps, self.start_step, self._now = num_steps, start_step, now
    self._t0 = now()
    self._t1 = self._t0
    self.first_reward = None
    self.last_reward = None

  def line(self, step: int, scalars: Mapping[str, float]) -> str:
    now = self._now()
    elapsed = now - self._t0
    done = step - self.start_step
    # The first step of a process includes compilation: the ETA comes from the steps after it.
    if done == 1:
      self._t1 = now
      eta = None
    else:
      eta = (now - self._t1) / (done - 1) * (self.num_steps - step)
    # A run's first policy ("" for an AR-only run, else "ar/" or "decoder/") is the one shown.
    prefix = next((p for p in POLICY_PREFIXES if f"{p}loss" in scalars), "")
    reward = scalars.get(f"{prefix}reward/mean")
    if reward is not None and math.isfinite(reward):
      self.first_reward = reward if self.first_reward is None else self.first_reward
      self.last_reward = reward
    parts = [f"step {step}/{self.num_steps}", f"{_clock(elapsed)} elapsed, ETA {'--' if eta is None else _clock(eta)}"]
    for key, label, fmt in SHOWN:
      value = scalars.get(prefix + key)
      if value is not None and math.isfinite(value):
        parts.append(f"{prefix}{label} {fmt.format(value)}")
    lo, hi = scalars.get(f"{prefix}ratio/min"), scalars.get(f"{prefix}ratio/max")
    if lo is not None and hi is not None:
      parts.append(f"ratio [{lo:.4f}, {hi:.4f}]")
    if scalars.get("time/step") is not None:
      parts.append(f"{scalars['time/step']:.2f} s/step")
    if scalars.get("skipped"):
      parts.append("SKIPPED (non-finite)")
    return " | ".join(parts)

  def alive(self, process: int, step: int, scalars: Mapping[str, float]) -> str:
    """The short line of a process other than 0 (process 0's line carries the metrics)."""
    seconds = scalars.get("time/step")
    return f"process {process}: step {step}/{self.num_steps} done" + (f" ({seconds:.2f} s)" if seconds else "")

  def summary(self, step: int, outputs: Mapping[str, str], stopped_by: str | None = None) -> str:
    """This process's steps (a resumed run counts from its resume), their reward, and where each output is
    (`outputs`: what -> path)."""
    elapsed = _clock(self._now() - self._t0)
    done = step - self.start_step
    steps = f"{done} step{'s' if done != 1 else ''}"
    if self.start_step and done:  # a resumed run: which steps were this run's
      steps += f" ({self.start_step + 1}-{step})" if done > 1 else f" (step {step})"
    how = f"stopped by {stopped_by} at step {step}/{self.num_steps} after {steps}" if stopped_by else f"done: {steps}"
    reward = ""
    if self.first_reward is not None:
      reward = f", reward {self.first_reward:.4g} -> {self.last_reward:.4g}"
    return f"{how} in {elapsed}{reward}; " + "; ".join(f"{what} in {path}" for what, path in outputs.items())
