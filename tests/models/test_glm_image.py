"""A component's random init (the tiny presets' weights) is the plain jitted init, bit for bit, however fast
it is compiled."""

import glmrl  # noqa: F401

import jax
import numpy as np
from flax import nnx

from glmrl.models import glm_image


def test_random_init_equals_the_plain_jitted_init():
  cfg = glm_image.preset_configs("tiny").vae  # the slowest to compile: 180 parameters, most of them convolutions
  _, cls = glm_image.COMPONENTS["vae"]
  want = jax.jit(lambda: nnx.split(cls(cfg, rngs=nnx.Rngs(3)))[1])()
  got = glm_image.init_params("vae", cfg, 3, None)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)
