"""Key map coverage between transformers' GlmImageForConditionalGeneration and GlmImageAR (tiny config).

Every reference state_dict key is matched by exactly one rule, every Flax parameter is produced
once with the right shape, keys and tensors round-trip bit-exactly.
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import dataclasses

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import GlmImageConfig, GlmImageForConditionalGeneration

from checkpoints_convert.maps.ar import RULES, StackedBias, StackedKernel
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.model import GlmImageAR

KEYMAP = KeyMap(RULES)
SINGLE_RULE_MAPS = [KeyMap([rule]) for rule in RULES]


@pytest.fixture(scope="module", params=["tiny", "tiny_without_biases"])
def sides(request):
  """(reference state_dict as numpy, {flax path: ShapeDtypeStruct}) for one config."""
  cfg = ARConfig.tiny()
  if request.param == "tiny_without_biases":
    cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, attention_bias=False),
                              vision=dataclasses.replace(cfg.vision, attention_bias=False))
  torch.manual_seed(0)
  ref = GlmImageForConditionalGeneration(GlmImageConfig(**cfg.to_hf()))
  hf = {k: v.numpy() for k, v in ref.state_dict().items()}
  model = nnx.eval_shape(lambda: GlmImageAR(cfg, rngs=nnx.Rngs(0)))
  flax = {flax_path_str(p): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  assert not jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param)))  # nothing but parameters to convert
  return hf, flax


def test_every_hf_key_matches_exactly_one_rule(sides):
  hf, _ = sides
  for key in hf:
    matches = [i for i, km in enumerate(SINGLE_RULE_MAPS) if km.hf_to_flax(key) is not None]
    assert len(matches) == 1, (key, [RULES[i] for i in matches])


def test_flax_params_produced_once_with_matching_shapes(sides):
  hf, flax = sides
  produced = {}
  for key, value in hf.items():
    path, transform = KEYMAP.hf_to_flax(key)
    assert path not in produced, (key, path, produced.get(path))
    produced[path] = key
    assert path in flax, (key, path)
    assert transform.flax_shape(value.shape) == tuple(flax[path].shape), (key, path)
    assert transform.hf_shape(tuple(flax[path].shape)) == tuple(value.shape), (key, path)
  assert set(produced) == set(flax), sorted(set(flax) ^ set(produced))


def test_keys_and_tensors_round_trip_exactly(sides):
  hf, _ = sides
  rng = np.random.default_rng(0)
  for key, value in hf.items():
    path, transform = KEYMAP.hf_to_flax(key)
    back_key, back_transform = KEYMAP.flax_to_hf(path)
    assert back_key == key and back_transform == transform
    x = rng.standard_normal(value.shape).astype(np.float32)
    y = transform.to_hf(transform.to_flax(x))
    assert y.shape == x.shape and np.array_equal(y, x), key


def test_stacked_transforms_split_fused_projections():
  w = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)  # torch [3*out, in], out = 2
  kernel = StackedKernel(3).to_flax(w)
  assert kernel.shape == (4, 3, 2)
  for j in range(3):  # member j of the fused weight is rows [j*out, (j+1)*out)
    np.testing.assert_array_equal(kernel[:, j, :], w[2 * j:2 * (j + 1)].T)
  bias = StackedBias(3).to_flax(np.arange(6.0))
  np.testing.assert_array_equal(bias, [[0, 1], [2, 3], [4, 5]])
  with pytest.raises(ValueError, match="stacked kernel"):
    StackedKernel(3).flax_shape((7, 4))
  with pytest.raises(ValueError, match="stacked bias"):
    StackedBias(2).hf_shape((3, 5))
