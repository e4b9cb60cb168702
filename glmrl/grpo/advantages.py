"""Group-relative advantages (GRPO, Dr. GRPO, RLOO)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from glmrl.grpo._checks import choice

SCALES = ("group", "batch", "none")
ESTIMATORS = ("grpo", "rloo")


def group_advantages(rewards, group_size, *, scale="group", estimator="grpo", eps=1e-6):
  """Advantages of a flat reward vector whose consecutive `group_size` runs share a prompt.

  estimator="grpo": r - group mean (DeepSeekMath, arXiv 2402.03300);
  estimator="rloo": r - mean of the other samples of the group.
  scale="group" divides by (unbiased group std + eps), "batch" by (unbiased std of
  all rewards + eps), "none" leaves the centred value (Dr. GRPO). The scale
  applies to either estimator. A group whose rewards are all equal gets exactly 0.
  """
  rewards = jnp.asarray(rewards)
  if rewards.ndim != 1:
    raise ValueError(f"rewards must be a flat [batch] array, got shape {tuple(rewards.shape)}")
  if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
    raise ValueError(f"group_size must be a Python int, got {group_size!r}")
  if group_size < 2:
    raise ValueError(f"group_size={group_size} must be at least 2 (advantages are relative to the group)")
  if rewards.shape[0] % group_size:
    raise ValueError(
        f"number of rewards {rewards.shape[0]} is not divisible by group_size={group_size}")
  choice("scale", scale, SCALES)
  choice("estimator", estimator, ESTIMATORS)
  return _group_advantages(rewards, int(group_size), scale, estimator, eps)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _group_advantages(rewards, group_size, scale, estimator, eps):
  r_GxN = rewards.astype(jnp.float32).reshape(-1, group_size)
  centred_GxN = r_GxN - r_GxN.mean(axis=1, keepdims=True)
  if estimator == "rloo":
    # r_i - (sum - r_i) / (n - 1) == n / (n - 1) * (r_i - mean).
    centred_GxN = centred_GxN * (group_size / (group_size - 1))
  if scale == "group":
    centred_GxN = centred_GxN / (jnp.std(r_GxN, axis=1, ddof=1, keepdims=True) + eps)
  elif scale == "batch":
    centred_GxN = centred_GxN / (jnp.std(r_GxN, ddof=1) + eps)
  # The mean of equal values need not round back to the value itself; pin such
  # groups to exactly zero instead of a rounding residue.
  constant_G1 = (r_GxN.max(axis=1, keepdims=True) == r_GxN.min(axis=1, keepdims=True))
  return jnp.where(constant_G1, 0.0, centred_GxN).reshape(-1)
