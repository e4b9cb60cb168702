"""`InitRngs` hands out the keys `nnx.Rngs` does, whichever way a module asks for them: the parameters built with
it under `jit` are bit for bit those built with `nnx.Rngs` (the stacked glm_image components: test_glm_image.py)."""

import glmrl  # noqa: F401

import jax
import numpy as np
from flax import nnx

from glmrl.models.init_rngs import InitRngs


class _Mixed(nnx.Module):
  """Flax layers (which call `rngs.params()`), an item lookup and a bare call, in one module."""

  def __init__(self, *, rngs, bare_call=True):
    self.linear = nnx.Linear(3, 4, rngs=rngs)
    self.conv = nnx.Conv(2, 5, kernel_size=(3, 3), rngs=rngs)
    self.embed = nnx.Embed(7, 4, rngs=rngs)
    self.norm = nnx.LayerNorm(4, rngs=rngs)
    self.item = nnx.Param(jax.random.normal(rngs["params"](), (2, 2)))
    self.call = nnx.Param(jax.random.uniform(rngs() if bare_call else rngs.params(), (3,)))


def _params(make_rngs, bare_call=True):
  return jax.jit(lambda: nnx.split(_Mixed(rngs=make_rngs(), bare_call=bare_call))[1])()


def _assert_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)


def test_a_seed_draws_what_nnx_rngs_draws():
  _assert_equal(_params(lambda: InitRngs(11)), _params(lambda: nnx.Rngs(11)))
  kernel = lambda seed: np.asarray(_params(lambda: InitRngs(seed))["linear"]["kernel"])
  assert not np.array_equal(kernel(12), kernel(11))


def test_a_key_draws_what_a_params_stream_of_that_key_draws():
  key = jax.random.fold_in(jax.random.key(3), 0x10FA)
  # Such Rngs have no default stream: every draw asks for `params`.
  _assert_equal(_params(lambda: InitRngs(key), False), _params(lambda: nnx.Rngs(params=key), False))
