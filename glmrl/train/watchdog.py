"""Warnings for a run that goes on without learning: every group's rewards identical (no advantage, no
gradient), a gradient of exactly zero, or a policy whose sampling entropy has collapsed, for `patience`
consecutive steps. Each is one console warning when its streak reaches `patience` (again every `patience`
steps while it lasts) and a metric counting the streak (`watchdog/...`). Non-finite losses have their own
stop (`train.max_consecutive_nonfinite`)."""

from __future__ import annotations

import math

# (name, metric of a policy, predicate on its value, what the warning says)
CHECKS = (
    ("no_signal", "reward/zero_variance_group_frac", lambda v: v >= 1.0,
     "every group's rewards are equal (within grpo.std_eps): zero advantages, nothing to learn (a reward that "
     "cannot tell the samples apart, or a collapsed policy)"),
    ("zero_grad", "grad_norm", lambda v: v == 0.0,
     "the gradient is exactly zero (no advantage survives the mask, or the loss does not reach the trained "
     "parameters)"),
    ("entropy_collapse", "policy/entropy", lambda v: v < 1e-3,
     "the sampling entropy has collapsed (every sample alike; a learning rate too high?)"),
)


class Watchdog:
  """Counts each check's consecutive steps per policy prefix ("" / "ar/" / "decoder/")."""

  def __init__(self, prefixes, patience: int = 5):
    self.prefixes, self.patience = tuple(prefixes), patience
    self.streaks = {(p, name): 0 for p in self.prefixes for name, *_ in CHECKS}

  def update(self, step: int, scalars: dict) -> tuple[dict, list[str]]:
    """(metrics `watchdog/<prefix><check>_steps`, warning lines) after a step's scalars."""
    metrics, warnings = {}, []
    for prefix in self.prefixes:
      for name, key, bad, what in CHECKS:
        value = scalars.get(prefix + key)
        if value is None:
          continue
        value = float(value)
        hit = math.isfinite(value) and bad(value)
        streak = self.streaks[(prefix, name)] = self.streaks[(prefix, name)] + 1 if hit else 0
        metrics[f"watchdog/{prefix}{name}_steps"] = streak
        if streak and streak % self.patience == 0:
          warnings.append(f"{prefix or 'policy '}{name}: {what}; {streak} steps in a row (step {step})")
    return metrics, warnings
