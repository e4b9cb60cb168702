"""The AR sampler's weights in the rollout layout (config.rollout.ar_weights = "gathered").

The update keeps the generator split over fsdp; a decode loop reading that layout gathers every weight again
at every token (402 all-gathers, 14.8 GiB per chip per token for the released t2i recipe on v5p-64, from the
compiled HLO). Before sampling, one program casts the weights to the compute dtype (the model casts each to
it at use anyway, so the numbers do not change) and reshards them without their fsdp split: tensor-parallel
over `tensor`, whole on every data x fsdp chip. LoRA adapters keep their dtype (they are small, and their
arithmetic is not the base's).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl import sharding as sharding_lib
from glmrl.models import lora as lora_lib


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def _rollout_dtype(variable, dtype):
  """The dtype a weight has in the rollout copy: `dtype` for a base parameter of a wider float dtype."""
  value_dtype = jnp.dtype(variable.dtype if hasattr(variable, "dtype") else variable[...].dtype)
  if (isinstance(variable, nnx.Param) and not isinstance(variable, lora_lib.LoraParam)
      and jnp.issubdtype(value_dtype, jnp.floating) and value_dtype.itemsize > jnp.dtype(dtype).itemsize):
    return jnp.dtype(dtype)
  return value_dtype


def cast(states, dtype):
  """`states` with every base parameter wider than `dtype` cast to it."""
  return jax.tree.map(lambda v: v.replace(v[...].astype(_rollout_dtype(v, dtype))), states, is_leaf=_is_variable)


def reshard_program(states, dtype):
  """The jitted cast + reshard of `states` (abstract or concrete; its shardings fix the program's)."""
  return jax.jit(functools.partial(cast, dtype=dtype), out_shardings=sharding_lib.gathered_shardings(states))


def abstract(states, dtype):
  """What `reshard_program` returns for abstract `states` (ShapeDtypeStructs with the run's shardings)."""
  return jax.tree.map(lambda v: v.replace(jax.ShapeDtypeStruct(v.shape, _rollout_dtype(v, dtype),
                                                               sharding=sharding_lib.without_fsdp(v.sharding))),
                      states, is_leaf=_is_variable)
