"""ARConfig <-> transformers GlmImageConfig round trips, released values and validation."""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import dataclasses

import jax.numpy as jnp
import pytest
from transformers import GlmImageConfig

from glmrl.models.ar.config import ARConfig, TextConfig, VisionConfig, VQConfig

# config.json of the release spells out the rotary settings that GlmImageConfig() leaves at defaults.
RELEASED_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                 "mrope_section": [8, 12, 12]}


@pytest.mark.parametrize("cfg", [ARConfig.full(), ARConfig.tiny()], ids=["full", "tiny"])
def test_round_trips(cfg):
  assert ARConfig.from_hf(cfg.to_hf()) == cfg
  hf = GlmImageConfig(**cfg.to_hf())
  assert ARConfig.from_hf(hf.to_dict()) == cfg
  assert hf.text_config.rope_parameters["mrope_section"] == list(cfg.text.mrope_section)
  assert hf.vision_config.depth == cfg.vision.depth and hf.vq_config.embed_dim == cfg.vq.embed_dim
  assert hf.image_token_id == cfg.image_token_id


def test_full_is_the_release():
  hf = GlmImageConfig(text_config={"rope_parameters": RELEASED_ROPE})
  assert ARConfig.from_hf(hf.to_dict()) == ARConfig.full()
  t = ARConfig.full().text
  assert (t.head_dim, t.rotary_dim, t.num_hidden_layers, t.vocab_size, t.vision_vocab_size) == (128, 64, 40, 168064,
                                                                                                16512)


def test_runtime_overrides():
  cfg = ARConfig.from_hf(ARConfig.tiny().to_hf(), dtype=jnp.bfloat16, remat=True)
  assert cfg.dtype == jnp.bfloat16 and cfg.remat and cfg.param_dtype == jnp.float32
  assert "dtype" not in cfg.to_hf()["text_config"]
  with pytest.raises(ValueError, match="runtime fields"):
    ARConfig.from_hf(ARConfig.tiny().to_hf(), text=TextConfig())


def test_legacy_rope_keys():
  d = ARConfig.tiny().to_hf()
  rope = d["text_config"].pop("rope_parameters")
  d["text_config"].update(rope_theta=500.0, partial_rotary_factor=0.5,
                          rope_scaling={"type": "default", "mrope_section": rope["mrope_section"]})
  cfg = ARConfig.from_hf(d)
  assert cfg.text.rope_theta == 500.0 and cfg.text.mrope_section == (2, 3, 3)


def test_invalid_configs_raise():
  tiny = ARConfig.tiny()
  with pytest.raises(ValueError, match="mrope_section"):
    ARConfig.from_hf(GlmImageConfig().to_dict())  # full rotary (factor 1.0) but [8, 12, 12] sections
  with pytest.raises(ValueError, match="num_key_value_heads"):
    dataclasses.replace(tiny.text, num_key_value_heads=3)
  with pytest.raises(ValueError, match="mrope_section"):
    dataclasses.replace(tiny.text, mrope_section=(2, 2, 2))
  with pytest.raises(ValueError, match="hidden_act"):
    dataclasses.replace(tiny.text, hidden_act="relu6")
  with pytest.raises(ValueError, match="spatial_merge_size"):
    dataclasses.replace(tiny.vision, spatial_merge_size=2)
  with pytest.raises(ValueError, match="latent_channels"):
    dataclasses.replace(tiny, vq=dataclasses.replace(tiny.vq, latent_channels=16))
  with pytest.raises(ValueError, match="image_start_token_id"):
    dataclasses.replace(tiny, image_start_token_id=10)
  with pytest.raises(ValueError, match="positive int"):
    VQConfig(num_embeddings=0)
  with pytest.raises(ValueError, match="rope_type"):
    d = tiny.to_hf()
    d["text_config"]["rope_parameters"]["rope_type"] = "yarn"
    ARConfig.from_hf(d)
  with pytest.raises(ValueError, match="model_type"):
    ARConfig.from_hf({"model_type": "glm4v"})
  with pytest.raises(ValueError, match="image_size"):
    VisionConfig.from_hf({"image_size": [32, 32]})
