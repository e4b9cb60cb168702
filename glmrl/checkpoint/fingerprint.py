"""A content fingerprint of a parameter state: what a LoRA checkpoint records of the base it adapts.

Hashing the bytes would fetch every weight to one host (20 GB for the released generator). Instead
each leaf is reduced on device to two numbers, its sum and a position-weighted sum (weights 1..251
cycling along the flattened leaf, so permuted or moved values change it too), and the host hashes
those with the leaf's path, shape and dtype. Sums are rounded to 6 significant digits before hashing,
because a reduction's rounding depends on how the leaf is sharded: the same base restored on another
mesh must give the same fingerprint. A change to the weights below that precision goes unseen.
"""

from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.checkpoint.params import flatten

_PERIOD = 251  # a prime: weight i of a leaf is 1 + (i mod 251)


@jax.jit
def _leaf_sums(leaves):
  def sums(x):
    x = x.astype(jnp.float32).reshape(-1)
    w = 1.0 + (jnp.arange(x.shape[0], dtype=jnp.int32) % _PERIOD).astype(jnp.float32)
    return jnp.stack([jnp.sum(x), jnp.sum(x * w)])

  return [sums(x) for x in leaves]


def fingerprint(state: nnx.State) -> str:
  """Hex SHA-256 of (path, shape, dtype, rounded sums) of every leaf of `state`."""
  flat = flatten(state)
  names = sorted(flat)
  sums = jax.device_get(_leaf_sums([flat[k] for k in names]))
  record = [[k, list(flat[k].shape), str(flat[k].dtype), [float(f"{v:.6g}") for v in np.asarray(s, np.float64)]]
            for k, s in zip(names, sums)]
  return hashlib.sha256(json.dumps(record).encode()).hexdigest()
