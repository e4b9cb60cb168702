"""`init_draws.split`: a function's draws batched in one program and the rest in another give the function's values,
and the draws really are batched."""

import jax
import jax.numpy as jnp
import numpy as np

from glmrl.models import init_draws


def _draws(key):
  """Draws as initializers make them: keys by fold_in; normals, truncated normals and uniforms of shapes that
  repeat and that do not; bits of two widths; one draw too large to batch; a value that is not a draw."""
  k = lambda n: jax.random.fold_in(key, n)
  return {
      "normal": [jax.random.normal(k(i), shape) for i, shape in enumerate(((4, 3), (4, 3), (7,), (2, 3, 5)))],
      "truncated": [jax.random.truncated_normal(k(10 + i), -2.0, 2.0, shape) for i, shape in enumerate(((8, 8),) * 3)],
      "uniform": jax.random.uniform(k(20), (5, 5), minval=-0.5, maxval=0.5),
      "bits": [jax.random.bits(k(30), (9,), jnp.uint8), jax.random.bits(k(31), (3, 3), jnp.uint32),
               jax.random.bits(k(32), (33,), jnp.uint32)],
      "large": jax.random.normal(k(40), (init_draws.MAX_BATCHED + 1,)),
      "zeros": jnp.zeros((3,)) + 1.0,
  }


def _assert_split_gives_the_values(key):
  draw, place = init_draws.split(_draws, key)
  got, want = jax.jit(place)(key, jax.jit(draw)(key)), jax.jit(_draws)(key)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)
  return draw


def _batches(draw, key) -> list[tuple]:
  stacked, _ = jax.eval_shape(draw, key)
  return sorted(tuple(x.shape) for outputs in stacked for x in outputs)


def test_the_two_programs_give_the_functions_values_bit_for_bit_with_its_draws_batched():
  draw = _assert_split_gives_the_values(jax.random.key(7))
  # The 12 fold-ins (the large draw's key too); the uniforms of the 4 normals (a normal is not batched whole: its
  # scaling by sqrt(2) must meet the initializer's in one program), padded to the largest (30 elements); the 3
  # truncated normals; the uniform of other bounds; the uint8 bits; the uint32 bits of 9 and 33 elements. The large
  # normal is made in `place`.
  assert _batches(draw, jax.random.key(7)) == sorted([(12,), (4, 30), (3, 64), (1, 25), (1, 9), (2, 33)])
  # Another key through the same programs: the key is their argument, not a constant in them.
  _assert_split_gives_the_values(jax.random.key(8))


def test_draws_whose_padding_would_be_large_are_batched_by_size(monkeypatch):
  monkeypatch.setattr(init_draws, "MAX_PADDED", 64)
  draw = _assert_split_gives_the_values(jax.random.key(7))
  # The normals' uniforms by powers of two (12 and 12 elements, 7, 30); the truncated normals, all of 64, still
  # together; the uint32 bits apart (9, 33).
  assert _batches(draw, jax.random.key(7)) == sorted([(12,), (2, 12), (1, 7), (1, 30), (3, 64), (1, 25), (1, 9),
                                                      (1, 9), (1, 33)])
