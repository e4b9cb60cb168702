"""A model stored in a converted folder (`config.json`, `params/`): its module built abstractly, its parameters
restored onto a sharding (`glmrl.checkpoint.params`)."""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from glmrl.checkpoint.params import first_device, read_config, restore_params
from glmrl.models.init_rngs import InitRngs


def load_module(directory: str, config_cls, module_cls, sharding=None, *, how_to_make: str, **config_overrides):
  """`module_cls(config_cls.from_hf(<directory>/config.json))` with its parameters restored from
  `directory` onto `sharding` (default: the first device); keyword arguments replace config fields.

  `how_to_make`: how a user writes such a folder, said when config.json is missing. The module is
  built abstractly (nothing allocated); non-parameter variables (buffers, RNG counters) are computed
  under jit, where the unused initialisers are dead code.
  """
  cfg = read_config(directory, config_cls.from_hf, how_to_make)
  if config_overrides:
    cfg = dataclasses.replace(cfg, **config_overrides)
  graphdef, abstract, rest = nnx.split(nnx.eval_shape(lambda: module_cls(cfg, rngs=InitRngs(0))), nnx.Param, ...)
  if jax.tree.leaves(rest):
    rest = jax.jit(lambda: nnx.split(module_cls(cfg, rngs=InitRngs(0)), nnx.Param, ...)[2])()
  return nnx.merge(graphdef, restore_params(directory, abstract, sharding or first_device()), rest)
