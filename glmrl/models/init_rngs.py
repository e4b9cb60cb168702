"""The random keys a module draws its initial parameters from while it is traced (`jit`, `eval_shape`).

`InitRngs(seed)` hands out the keys `nnx.Rngs(seed)` does, whatever stream is asked for (`rngs.params()`,
`rngs['params']`, `rngs()`): the n-th draw is `fold_in(key(seed), n)`, so the parameters are bit for bit those of
`nnx.Rngs(seed)` (and `InitRngs(key)` those of `nnx.Rngs(params=key)`). It counts the draws in Python instead of in
an `nnx.Variable`: under a trace, each `nnx.Rngs` draw writes its traced count back through `Variable.set_value`,
whose sharding check raises and catches an AttributeError on the tracer, and JAX writes that error's message by
walking the trace back through every earlier draw (`DynamicJaxprTracer._origin_msg`): quadratic in the number of
parameters. The full-size generator (1,011 parameters) took 15.3 s to build abstractly with `nnx.Rngs` and 1.2 s
with this (bench/startup.py).
"""

from __future__ import annotations

import jax


class InitRngs:
  """`nnx.Rngs(seed)`'s keys for building a module, the draws counted in Python (see the module docstring).
  Only for construction: modules keep no reference to it."""

  def __init__(self, seed: int | jax.Array):
    self._key = jax.random.key(seed) if isinstance(seed, int) else seed
    self._draws = 0

  def __call__(self) -> jax.Array:
    key = jax.random.fold_in(self._key, self._draws)
    self._draws += 1
    return key

  def __getattr__(self, stream: str):
    if stream.startswith("_"):
      raise AttributeError(stream)
    return self  # every stream is the one counter, as nnx.Rngs(seed)'s default stream

  def __getitem__(self, stream: str):
    return self
