"""Loads a torch reference model's weights into our NNX model through a component's key map."""

import glmrl  # noqa: F401

import jax.numpy as jnp
from flax import nnx

from checkpoints_convert.rules import KeyMap, flax_path_str


def abstract(model_cls, cfg):
  """The model with ShapeDtypeStruct parameters (skips random init, which is slow on CPU)."""
  return nnx.eval_shape(lambda: model_cls(cfg, rngs=nnx.Rngs(0)))


def load_state_dict(model: nnx.Module, state_dict: dict, rules) -> nnx.Module:
  """Writes every torch tensor into `model` through `rules`; fails on any key or parameter left over."""
  key_map = KeyMap(rules)
  params = {flax_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  filled = set()
  for key, tensor in state_dict.items():
    match = key_map.hf_to_flax(key)
    assert match is not None, f"no rule for HF key {key}"
    path, transform = match
    assert path in params, f"{key} -> {path}: no such Flax parameter"
    value = transform.to_flax(tensor.detach().float().cpu().numpy())
    assert params[path].shape == value.shape, (key, path, params[path].shape, value.shape)
    params[path].set_value(jnp.asarray(value, params[path].dtype))
    filled.add(path)
  missing = sorted(set(params) - filled)
  assert not missing, f"Flax parameters not filled: {missing}"
  return model


def port(torch_model, model_cls, cfg, rules):
  """Our model holding `torch_model`'s weights."""
  return load_state_dict(abstract(model_cls, cfg), torch_model.state_dict(), rules)


def assert_rules_cover(rules, hf_keys, flax_paths):
  """Each HF key matches exactly one rule, and the rules map the HF keys onto exactly `flax_paths`."""
  key_map = KeyMap(rules)
  for key in hf_keys:
    matches = [r for r in rules if KeyMap([r]).hf_to_flax(key)]
    assert len(matches) == 1, (key, matches)
  assert {key_map.hf_to_flax(k)[0] for k in hf_keys} == set(flax_paths)
  for path in flax_paths:
    assert key_map.flax_to_hf(path)[0] in hf_keys, path
