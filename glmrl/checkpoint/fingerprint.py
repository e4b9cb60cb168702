"""A content fingerprint of a parameter state: what a LoRA checkpoint records of the base it adapts.

Hashing the bytes would fetch every weight to one host (20 GB for the released generator). Instead each
leaf is reduced on device to two integers: the sum of its values' bit patterns, and the sum of those bit
patterns times weights 1..251 cycling along the flattened leaf (so permuted or moved values change it
too), both modulo 2^32. Integer addition modulo 2^32 does not depend on the order it is done in, so
the same base gives the same fingerprint on any mesh and any CPU or accelerator; the host hashes the
integers with the leaf's path, shape and dtype.

The earlier fingerprint (float sums rounded to 6 digits, recorded as a bare hex digest) rounded
differently from one CPU to another, so it cannot be recomputed to compare: `is_legacy` tells one apart.
"""

from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.checkpoint.params import flatten

SCHEME = "bits-mod-2^32:"  # the prefix of a fingerprint of this kind
_PERIOD = 251  # a prime: weight i of a leaf is 1 + (i mod 251)
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


@jax.jit
def _leaf_sums(leaves):
  def sums(x):
    bits = jax.lax.bitcast_convert_type(x.reshape(-1), _UNSIGNED[x.dtype.itemsize]).astype(jnp.uint32)
    w = 1 + jnp.arange(bits.shape[0], dtype=jnp.uint32) % _PERIOD
    return jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * w, dtype=jnp.uint32)])

  return [sums(x) for x in leaves]


def fingerprint(state: nnx.State) -> str:
  """`SCHEME` + hex SHA-256 of (path, shape, dtype, the two sums) of every leaf of `state`."""
  flat = flatten(state)
  names = sorted(flat)
  for k in names:
    if flat[k].dtype.itemsize not in _UNSIGNED:
      raise ValueError(f"fingerprint: leaf {k} has dtype {flat[k].dtype} ({flat[k].dtype.itemsize}-byte values)")
  sums = jax.device_get(_leaf_sums([flat[k] for k in names]))
  record = [[k, list(flat[k].shape), str(flat[k].dtype), [int(v) for v in np.asarray(s)]]
            for k, s in zip(names, sums)]
  return SCHEME + hashlib.sha256(json.dumps(record).encode()).hexdigest()


def is_legacy(value) -> bool:
  """Whether a recorded fingerprint is of the earlier, rounded-float kind (a bare hex digest)."""
  return isinstance(value, str) and not value.startswith(SCHEME)
