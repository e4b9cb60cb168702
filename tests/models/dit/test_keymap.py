"""checkpoints_convert/maps/dit.py: coverage both ways and bit-exact transforms."""

import glmrl  # noqa: F401

import jax
import numpy as np
import pytest
from flax import nnx

from checkpoints_convert.maps.dit import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.models.dit import GlmImageDiT

KEY_MAP = KeyMap(RULES)
SINGLE_RULE_MAPS = [KeyMap([rule]) for rule in RULES]


def hf_shapes(ref) -> dict:
  return {k: tuple(v.shape) for k, v in ref.state_dict().items()}


def flax_shapes(cfg) -> dict:
  abstract = nnx.eval_shape(lambda: GlmImageDiT(cfg, rngs=nnx.Rngs(0)))
  return {flax_path_str(p): tuple(v.shape) for p, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))}


def check_coverage(hf: dict, flax: dict) -> None:
  produced = {}
  for key, shape in hf.items():
    n_rules = sum(m.hf_to_flax(key) is not None for m in SINGLE_RULE_MAPS)
    assert n_rules == 1, f"{key} matches {n_rules} rules"
    path, transform = KEY_MAP.hf_to_flax(key)
    assert path not in produced, f"{key} and {produced.get(path)} both map to {path}"
    produced[path] = key
    assert path in flax, f"{key} -> {path}: not a Flax parameter"
    assert transform.flax_shape(shape) == flax[path], (key, path, shape, flax[path])
    assert KEY_MAP.flax_to_hf(path) == (key, transform)
  assert set(produced) == set(flax), f"Flax parameters without HF key: {sorted(set(flax) - set(produced))}"
  for path in flax:
    assert sum(m.flax_to_hf(path) is not None for m in SINGLE_RULE_MAPS) == 1, path


def test_tiny_coverage_both_ways(ref_model, tiny_cfg):
  check_coverage(hf_shapes(ref_model), flax_shapes(tiny_cfg))


def test_full_coverage_both_ways(full_ref_meta, full_flax_shapes):
  check_coverage(hf_shapes(full_ref_meta), full_flax_shapes)


def test_round_trip_bit_exact(ref_model):
  for key, tensor in ref_model.state_dict().items():
    path, transform = KEY_MAP.hf_to_flax(key)
    hf = tensor.numpy()
    back_key, back_transform = KEY_MAP.flax_to_hf(path)
    back = back_transform.to_hf(transform.to_flax(hf))
    assert back_key == key
    assert back.dtype == hf.dtype and back.shape == hf.shape
    assert back.tobytes() == hf.tobytes(), key


def test_linear_kernels_are_transposed(ref_model, model):
  """Spot check of the convention: torch Linear weight [out, in] is the kernel [in, out]."""
  w = ref_model.transformer_blocks[1].attn1.to_q.weight.detach().numpy()
  np.testing.assert_array_equal(np.asarray(model.blocks[1].attn.q.kernel[...]), w.T)


@pytest.mark.parametrize("key", ["transformer_blocks.0.attn1.norm_q.weight", "pos_embed.weight",
                                 "transformer_blocks.x.ff.net.2.weight"])
def test_unknown_keys_do_not_match(key):
  assert KEY_MAP.hf_to_flax(key) is None


def test_every_parameter_has_logical_sharding(tiny_cfg):
  abstract = nnx.eval_shape(lambda: GlmImageDiT(tiny_cfg, rngs=nnx.Rngs(0)))
  for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
    names = var.get_metadata("out_sharding", None)
    assert names is not None and len(names) == len(var.shape), (flax_path_str(path), names, var.shape)
  assert jax.tree.leaves(nnx.state(abstract, nnx.Param))
