"""Cheap deterministic image statistics (pure JAX): demo rewards for tiny random models."""

import jax.numpy as jnp

from glmrl.rewards.registry import check_images, register

# ITU-R BT.601 luma weights.
_LUMA = (0.299, 0.587, 0.114)


def _unit_rgb(images, name):
  check_images(images, name)
  return jnp.asarray(images).astype(jnp.float32) / 255.0


def brightness(images, prompts, metadata):
  """Mean BT.601 luma in [0, 1]."""
  x_Bxhxwx3 = _unit_rgb(images, "brightness")
  luma_Bxhxw = jnp.einsum("bhwc,c->bhw", x_Bxhxwx3, jnp.asarray(_LUMA, jnp.float32))
  return luma_Bxhxw.mean(axis=(1, 2))


def colorfulness(images, prompts, metadata):
  """Hasler & Suesstrunk (2003) colorfulness on [0, 1] RGB: sigma_rgyb + 0.3 * mu_rgyb."""
  x_Bxhxwx3 = _unit_rgb(images, "colorfulness")
  r, g, b = x_Bxhxwx3[..., 0], x_Bxhxwx3[..., 1], x_Bxhxwx3[..., 2]
  rg_Bxhxw = r - g
  yb_Bxhxw = 0.5 * (r + g) - b
  sigma = jnp.sqrt(rg_Bxhxw.var(axis=(1, 2)) + yb_Bxhxw.var(axis=(1, 2)))
  mu = jnp.sqrt(rg_Bxhxw.mean(axis=(1, 2)) ** 2 + yb_Bxhxw.mean(axis=(1, 2)) ** 2)
  return sigma + 0.3 * mu


def saturation(images, prompts, metadata):
  """Mean HSV saturation (max - min) / max in [0, 1]; black pixels count as 0."""
  x_Bxhxwx3 = _unit_rgb(images, "saturation")
  hi_Bxhxw = x_Bxhxwx3.max(axis=-1)
  lo_Bxhxw = x_Bxhxwx3.min(axis=-1)
  sat_Bxhxw = jnp.where(hi_Bxhxw > 0, (hi_Bxhxw - lo_Bxhxw) / jnp.where(hi_Bxhxw > 0, hi_Bxhxw, 1.0), 0.0)
  return sat_Bxhxw.mean(axis=(1, 2))


register("brightness", brightness, pure_jax=True)
register("colorfulness", colorfulness, pure_jax=True)
register("saturation", saturation, pure_jax=True)
