"""Standard normal draws of the samplers' noise, drawn flat.

`jax.random.normal(key, shape)` and the draw of shape (n,) reshaped to `shape` hold the same values (JAX's
partitionable Threefry, the default since JAX 0.5, hashes each element's row-major index, and the transform is
elementwise), but XLA:CPU compiles a draw of rank 3 or 4 several times more slowly (docs/benchmarks.md,
"Measurements behind the library's defaults").
"""

import math

import jax


def normal(key, shape, dtype=float):
  """`jax.random.normal(key, shape, dtype)`, bit for bit, as one flat draw."""
  return jax.random.normal(key, (math.prod(shape),), dtype).reshape(shape)
