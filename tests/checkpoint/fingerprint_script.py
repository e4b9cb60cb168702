"""Run by test_fingerprint.py with 8 host devices."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from glmrl.checkpoint.fingerprint import SCHEME, fingerprint, is_legacy  # noqa: E402


def state_of(w_16x24, b_24, e_40x8):
  module = nnx.Module()
  module.w = nnx.Param(w_16x24)
  module.b = nnx.Param(b_24)
  module.e = nnx.Param(e_40x8)
  return nnx.state(module)


rng = np.random.default_rng(0)
w = rng.standard_normal((16, 24)).astype(np.float32)
b = rng.standard_normal(24).astype(np.float32)
e = jnp.asarray(rng.standard_normal((40, 8)), jnp.bfloat16)
one = fingerprint(state_of(jnp.asarray(w), jnp.asarray(b), e))
assert one.startswith(SCHEME) and not is_legacy(one), one
assert is_legacy("ba7e7ff01e364cd3c855c3f1c5959616fafbac5bfa3af5b31435a2ea1c0e9b80")

mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
on = lambda x, *spec: jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))
sharded = fingerprint(state_of(on(w, "b", "a"), on(b, "a"), on(e, ("a", "b"))))
assert sharded == one, (sharded, one)

flipped = w.copy()
flipped.view(np.uint32)[3, 5] ^= 1  # the lowest mantissa bit of one value
assert fingerprint(state_of(jnp.asarray(flipped), jnp.asarray(b), e)) != one
swapped = w.copy()
swapped[[0, 1]] = swapped[[1, 0]]  # two rows trade places: the same sum
assert fingerprint(state_of(jnp.asarray(swapped), jnp.asarray(b), e)) != one
assert fingerprint(state_of(jnp.asarray(w), jnp.asarray(b), e.at[39, 7].add(1))) != one
print("ok")
