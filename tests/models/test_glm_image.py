"""A component's random init (the tiny presets' weights) is the plain jitted init, bit for bit, however it is
compiled: two programs with the draws batched (glmrl/models/init_draws.py), at backend optimisation level 1."""

import glmrl  # noqa: F401

import jax
import numpy as np
import pytest
from flax import nnx

from glmrl.models import glm_image


# The VAE: 180 parameters, most of them convolutions (truncated normals), zeros and ones. The generator: its
# embeddings are normals scaled by the initializer, the case where one program folds two constants into one.
@pytest.mark.parametrize("name", ["vae", "ar"])
def test_random_init_equals_the_plain_jitted_init(name):
  cfg = getattr(glm_image.preset_configs("tiny"), name)
  _, cls = glm_image.COMPONENTS[name]
  want = jax.jit(lambda: nnx.split(cls(cfg, rngs=nnx.Rngs(3)))[1])()
  got = glm_image.init_params(name, cfg, 3, None)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)
