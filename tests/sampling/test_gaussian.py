"""The samplers' flat normal draws hold jax.random.normal's values bit for bit, alone and vmapped over keys."""

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.sampling import gaussian


# Small shapes: the shaped reference draws of rank 3 and 4 are the slow compilations (glmrl/sampling/gaussian.py).
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 2, 7), (6,), ()])
@pytest.mark.parametrize("dtype", [float, jnp.bfloat16])
def test_a_flat_draw_is_the_shaped_draw(shape, dtype):
  key = jax.random.key(7)
  got, want = gaussian.normal(key, shape, dtype), jax.random.normal(key, shape, dtype)
  assert got.dtype == want.dtype
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_vmapped_over_keys_as_the_sde_window_draws():
  keys = jax.random.split(jax.random.key(3), 4)
  draw = lambda fn: jax.jit(jax.vmap(lambda k: fn(jax.random.fold_in(k, 2), (4, 3, 5), jnp.float32)))(keys)
  np.testing.assert_array_equal(np.asarray(draw(gaussian.normal)), np.asarray(draw(jax.random.normal)))
