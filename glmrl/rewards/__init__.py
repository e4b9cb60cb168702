"""Reward functions for GRPO: a registry, built-in rewards and their weighted composition.

Importing this package registers the built-ins: `brightness`, `colorfulness`,
`saturation`, `target_neg_mse`, `target_psnr` (pure JAX) and
`jpeg_compressibility` (host-side).
"""

from glmrl.rewards import image_stats, jpeg, target  # noqa: F401  (registers the built-ins)
from glmrl.rewards.compose import RewardComposer, group_normalize
from glmrl.rewards.registry import Reward, get, names, register, unregister

__all__ = ["Reward", "RewardComposer", "get", "group_normalize", "names", "register", "unregister"]
