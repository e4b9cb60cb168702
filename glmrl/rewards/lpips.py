"""The `lpips` reward: -LPIPS (`glmrl.models.lpips`) to `metadata["target_image"]` (0 for a perfect match).

Model-backed: `make_lpips_reward(model)` closes over a loaded model; `lpips_reward_factory(
weights_dir=...)` loads a folder written by `python -m checkpoints_convert.lpips`:

    {"name": "lpips", "weight": 1.0, "kwargs": {"weights_dir": "/ckpts/lpips_vgg"}}

Images and target are compared at their own resolution (same shape, at least 16 px a side).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from glmrl.models.lpips import LPIPS, load_lpips
from glmrl.rewards.registry import check_images, register_factory, require_metadata


def lpips_distance(model: LPIPS, images, target) -> jax.Array:
  """LPIPS [B] between uint8 `images` and `target` (both [B, H, W, 3], same shape)."""
  check_images(images, "lpips")
  check_images(target, "lpips target_image")
  if tuple(target.shape) != tuple(images.shape):
    raise ValueError(f"reward 'lpips': target_image shape {tuple(target.shape)} != images shape "
                     f"{tuple(images.shape)}")
  return model(jnp.asarray(images), jnp.asarray(target))


def make_lpips_reward(model: LPIPS):
  """A pure-JAX reward fn(images, prompts, metadata) = -LPIPS(images, metadata['target_image'])."""

  def lpips_reward(images, prompts, metadata):
    target = require_metadata(metadata, "target_image", "lpips")
    return -lpips_distance(model, images, target)

  return lpips_reward


@functools.lru_cache(maxsize=4)
def _cached_model(weights_dir: str, sharding) -> LPIPS:
  return load_lpips(weights_dir, sharding)


def lpips_reward_factory(weights_dir: str, *, sharding=None):
  """Loads (once per folder and sharding) the converted LPIPS weights and returns the reward fn."""
  if not isinstance(weights_dir, str) or not weights_dir:
    raise ValueError(f"reward 'lpips': weights_dir={weights_dir!r} must name a converted LPIPS folder")
  return make_lpips_reward(_cached_model(os.path.abspath(weights_dir), sharding))


register_factory("lpips", lpips_reward_factory, pure_jax=True, needs=("target_image",))
