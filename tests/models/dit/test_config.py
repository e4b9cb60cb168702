"""DiTConfig: HF round trip, released values, defaults, validation."""

import glmrl  # noqa: F401

import json

import jax.numpy as jnp
import pytest

from glmrl.models.dit import DiTConfig
from glmrl.models.dit.config import HF_FIELDS
from tests import shared_facts

RELEASED = str(shared_facts.GLM_IMAGE / "transformer_config.json")


def test_full_is_the_released_config():
  with open(RELEASED) as f:
    released = json.load(f)
  assert DiTConfig.full().to_hf() == released
  assert DiTConfig.from_hf(released) == DiTConfig.full()
  assert DiTConfig.full().inner_dim == 4096


def test_round_trips_and_overrides():
  tiny = DiTConfig.tiny()
  assert DiTConfig.from_hf(tiny.to_hf()) == tiny
  bf16 = DiTConfig.from_hf(tiny.to_hf(), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  assert bf16.dtype == jnp.bfloat16 and bf16.param_dtype == jnp.bfloat16
  assert bf16.to_hf() == tiny.to_hf()


def test_missing_keys_take_the_reference_defaults():
  from diffusers import GlmImageTransformer2DModel

  ref = GlmImageTransformer2DModel.from_config({"num_layers": 1, "attention_head_dim": 8, "num_attention_heads": 2})
  ours = DiTConfig.from_hf({"num_layers": 1})
  assert {k: ours.to_hf()[k] for k in HF_FIELDS if k not in ("attention_head_dim", "num_attention_heads")} == {
      k: ref.config[k] for k in HF_FIELDS if k not in ("attention_head_dim", "num_attention_heads")}
  assert (ours.attention_head_dim, ours.num_attention_heads) == (40, 64)


@pytest.mark.parametrize("bad, match", [
    (dict(num_layers=0), "num_layers=0"),
    (dict(patch_size=2.0), "patch_size=2.0"),
    (dict(attention_head_dim=18), "divisible by 4"),
    (dict(attention_impl="flash"), "attention_impl"),
])
def test_validation(bad, match):
  with pytest.raises(ValueError, match=match):
    DiTConfig.tiny(**bad)


def test_from_hf_errors():
  with pytest.raises(ValueError, match="_class_name"):
    DiTConfig.from_hf({"_class_name": "AutoencoderKL"})
  with pytest.raises(ValueError, match="HF fields"):
    DiTConfig.from_hf({}, num_layers=2)
  with pytest.raises(ValueError, match="must be a dict"):
    DiTConfig.from_hf("transformer/config.json")
