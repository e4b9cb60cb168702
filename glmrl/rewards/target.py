"""Similarity to `metadata["target_image"]` (pure JAX), on images scaled to [0, 1]."""

import jax.numpy as jnp

from glmrl.rewards.registry import check_images, register, require_metadata


def _mse(images, metadata, name):
  check_images(images, name)
  target = require_metadata(metadata, "target_image", name)
  check_images(target, name + " target_image")
  if tuple(target.shape) != tuple(images.shape):
    raise ValueError(f"reward {name!r}: target_image shape {tuple(target.shape)} != images shape "
                     f"{tuple(images.shape)}")
  x_Bxhxwx3 = jnp.asarray(images).astype(jnp.float32) / 255.0
  t_Bxhxwx3 = jnp.asarray(target).astype(jnp.float32) / 255.0
  return jnp.square(x_Bxhxwx3 - t_Bxhxwx3).mean(axis=(1, 2, 3))


def target_neg_mse(images, prompts, metadata):
  """-MSE to the target; 0 is a perfect match."""
  return -_mse(images, metadata, "target_neg_mse")


def target_psnr(images, prompts, metadata, max_db: float = 100.0):
  """PSNR in dB to the target (peak 1), capped at `max_db` so identical images stay finite."""
  if not max_db > 0:
    raise ValueError(f"reward 'target_psnr': max_db={max_db!r} must be > 0")
  mse = _mse(images, metadata, "target_psnr")
  floor = 10.0 ** (-max_db / 10.0)
  return -10.0 * jnp.log10(jnp.maximum(mse, floor))


register("target_neg_mse", target_neg_mse, pure_jax=True, needs=("target_image",))
register("target_psnr", target_psnr, pure_jax=True, needs=("target_image",))
