import glmrl  # noqa: F401

import json

import pytest
import torch
from diffusers import GlmImageTransformer2DModel
from flax import nnx

from checkpoints_convert.rules import flax_path_str
from glmrl.models.dit import DiTConfig, GlmImageDiT
from tests.models.dit import torch_ref
from tests import shared_facts


@pytest.fixture(scope="session")
def tiny_cfg():
  return DiTConfig.tiny()


@pytest.fixture(scope="session")
def ref_model(tiny_cfg):
  return torch_ref.reference(tiny_cfg, seed=0)


@pytest.fixture(scope="session")
def model(ref_model, tiny_cfg):
  return torch_ref.ported(ref_model, tiny_cfg)


@pytest.fixture(scope="session")
def full_hf_config():
  with open(shared_facts.GLM_IMAGE / "transformer_config.json") as f:
    return json.load(f)


@pytest.fixture(scope="session")
def full_abstract_model(full_hf_config):
  """The released-size model via nnx.eval_shape (nothing allocated)."""
  cfg = DiTConfig.from_hf(full_hf_config)
  return nnx.eval_shape(lambda: GlmImageDiT(cfg, rngs=nnx.Rngs(0)))


@pytest.fixture(scope="session")
def full_flax_shapes(full_abstract_model):
  """{flax path: shape} of the released-size model."""
  state = nnx.state(full_abstract_model, nnx.Param)
  return {flax_path_str(p): tuple(v.shape) for p, v in nnx.to_flat_state(state)}


@pytest.fixture(scope="session")
def full_ref_meta(full_hf_config):
  """The released-size reference on torch's meta device."""
  with torch.device("meta"):
    return GlmImageTransformer2DModel.from_config(full_hf_config)
