"""Group-relative advantages (GRPO, Dr. GRPO, RLOO).

One std convention throughout the project: the unbiased (ddof=1) standard deviation, as TRL and
verl compute it (`torch.std`), here and in the per-reward normalisation of `glmrl.rewards`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from glmrl.grpo._checks import choice, is_static

SCALES = ("group", "batch", "none")
ESTIMATORS = ("grpo", "rloo")
# Default relative threshold below which a group's reward spread counts as rounding noise.
STD_EPS = 1e-5


def _check(rewards, group_size, std_eps):
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
  if is_static(std_eps) and not 0.0 <= std_eps < 1.0:
    raise ValueError(f"std_eps={std_eps} must be in [0, 1) (a fraction of the group's largest |reward|)")
  return rewards


def constant_groups(rewards, group_size, *, std_eps=STD_EPS):
  """[G] bool: groups whose rewards are equal, or whose spread is rounding noise.

  A group is near-constant when its unbiased std is at most std_eps * max|r| over the group: float
  rounding is relative to the magnitude, and the group's own magnitude keeps the test local (a
  prompt whose rewards sit at a large offset does not silence the other prompts). Exact equality
  is checked on its own, since the std of equal floats can round to a small non-zero value.
  """
  rewards = _check(rewards, group_size, std_eps)
  return _constant_groups(rewards.astype(jnp.float32).reshape(-1, int(group_size)), std_eps)


def _constant_groups(r_PxG, std_eps):
  scale_P = jnp.max(jnp.abs(r_PxG), axis=1)
  std_P = jnp.std(r_PxG, axis=1, ddof=1)
  equal_P = jnp.max(r_PxG, axis=1) == jnp.min(r_PxG, axis=1)
  return equal_P | (std_P <= jnp.asarray(std_eps, jnp.float32) * scale_P)


def group_advantages(rewards, group_size, *, scale="group", estimator="grpo", std_eps=STD_EPS):
  """Advantages of a flat reward vector whose consecutive `group_size` runs share a prompt.

  estimator="grpo": r - group mean (DeepSeekMath, arXiv 2402.03300);
  estimator="rloo": r - mean of the other samples of the group.
  scale="group" divides by the unbiased group std, "batch" by the unbiased std of all rewards,
  "none" leaves the centred value (Dr. GRPO). The scale applies to either estimator. A constant
  or near-constant group (`constant_groups`, threshold `std_eps`) gets exactly 0 under every scale:
  dividing its rounding noise by its own tiny std would give it advantages of order one.
  """
  rewards = _check(rewards, group_size, std_eps)
  choice("scale", scale, SCALES)
  choice("estimator", estimator, ESTIMATORS)
  return _group_advantages(rewards, int(group_size), scale, estimator, std_eps)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _group_advantages(rewards, group_size, scale, estimator, std_eps):
  r_PxG = rewards.astype(jnp.float32).reshape(-1, group_size)
  centred_PxG = r_PxG - r_PxG.mean(axis=1, keepdims=True)
  if estimator == "rloo":
    # r_i - (sum - r_i) / (n - 1) == n / (n - 1) * (r_i - mean).
    centred_PxG = centred_PxG * (group_size / (group_size - 1))
  constant_Px1 = _constant_groups(r_PxG, std_eps)[:, None]
  if scale == "group":
    std = jnp.std(r_PxG, axis=1, ddof=1, keepdims=True)
  elif scale == "batch":
    std = jnp.std(r_PxG, ddof=1)
  else:
    std = jnp.ones((), jnp.float32)
  # Every non-constant group has std > 0; the guard only keeps 0/0 out of the discarded branch.
  safe_std = jnp.where(std > 0, std, 1.0)
  return jnp.where(constant_Px1, 0.0, centred_PxG / safe_std).reshape(-1)
