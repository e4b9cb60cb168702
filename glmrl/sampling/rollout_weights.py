"""The AR sampler's weights in the rollout layout (config.rollout.ar_weights = "gathered").

The update keeps the generator split over fsdp; a decode loop reading that layout gathers every weight again
at every token (402 all-gathers, 14.8 GiB per chip per token for the released t2i recipe on v5p-64, from the
compiled HLO). Before sampling, a few programs in turn (`Reshard`) cast the weights to the compute dtype (the
model casts each to it at use anyway, so the numbers do not change) and reshard them without their fsdp split:
tensor-parallel over `tensor`, whole on every data x fsdp chip. LoRA adapters keep their dtype (they are small,
and their arithmetic is not the base's).
"""

from __future__ import annotations

import functools
import math

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


# Bytes of the rollout copy per reshard program. As one program, XLA gathered every layer's kernels before copying
# any into its output layout, all their gathered forms live at once: on v5e-256 (fsdp 128 x tensor 2) 5.1 GiB of
# temporaries beside the 9.5 GiB copy, over the chip's HBM. (An optimization barrier between parts of one program
# did not stop it: the copies still came last.) Separate programs run one after another, each's outputs final.
PART_BYTES = 2 ** 30


class Reshard:
  """The cast + reshard of a tree of states (`cast`, then each array without its fsdp split) as consecutive
  jitted programs over parts of about `part_bytes` (default `PART_BYTES`) of output, in tree order. Built from
  `states` (abstract or concrete): their shardings fix the programs'; called on states of the same structure."""

  def __init__(self, states, dtype, part_bytes: int | None = None):
    part_bytes = part_bytes or PART_BYTES
    variables, self.treedef = jax.tree.flatten(states, is_leaf=_is_variable)
    self.parts, size = [[]], 0
    for i, variable in enumerate(variables):
      if size >= part_bytes:  # the open part is full: start the next
        self.parts, size = self.parts + [[]], 0
      self.parts[-1].append(i)
      size += math.prod(variable.shape) * _rollout_dtype(variable, dtype).itemsize
    self.programs = [jax.jit(functools.partial(cast, dtype=dtype),
                             out_shardings=sharding_lib.gathered_shardings([variables[i] for i in part]))
                     for part in self.parts]

  def _split(self, states):
    variables = self.treedef.flatten_up_to(states)
    return [[variables[i] for i in part] for part in self.parts]

  def __call__(self, states):
    out = [None] * self.treedef.num_leaves
    for part, program, inputs in zip(self.parts, self.programs, self._split(states)):
      for i, variable in zip(part, program(inputs)):
        out[i] = variable
    return jax.tree.unflatten(self.treedef, out)

  def lower(self, states) -> tuple:
    """Each part's lowering, in the order they run."""
    return tuple(program.lower(inputs) for program, inputs in zip(self.programs, self._split(states)))


def abstract(states, dtype):
  """What `Reshard` returns for abstract `states` (ShapeDtypeStructs with the run's shardings)."""
  return jax.tree.map(lambda v: v.replace(jax.ShapeDtypeStruct(v.shape, _rollout_dtype(v, dtype),
                                                               sharding=sharding_lib.without_fsdp(v.sharding))),
                      states, is_leaf=_is_variable)
