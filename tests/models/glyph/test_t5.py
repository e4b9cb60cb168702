"""T5 glyph encoder parity with transformers' T5EncoderModel (float32, tiny random configs, weights
via the key map). Tolerance: 1e-4 max abs on last_hidden_state."""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import T5Config, T5EncoderModel
from transformers.models.t5.modeling_t5 import T5Attention

from checkpoints_convert.maps.glyph import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.models.glyph import T5Encoder, T5EncoderConfig
from glmrl.models.glyph.t5 import relative_position_buckets
from tests import torch_port

ATOL = 1e-4
KEYMAP = KeyMap(RULES)
# Gated GELU (ByT5) and the plain ReLU feed-forward of original T5.
CONFIGS = {"gated-gelu": T5EncoderConfig.tiny(), "relu": T5EncoderConfig.tiny(feed_forward_proj="relu")}


def torch_model(cfg: T5EncoderConfig, device=None):
  if device == "meta":
    with torch.device("meta"):
      return T5EncoderModel(T5Config(**cfg.to_hf()))
  return T5EncoderModel(T5Config(**cfg.to_hf())).eval()


def flax_params(model) -> dict:
  return {flax_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}




@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request):
  cfg = CONFIGS[request.param]
  torch.manual_seed(0)
  ref = torch_model(cfg)
  with torch.no_grad():  # layer norms initialise to 1; randomise them so the map is exercised
    for name, p in ref.named_parameters():
      if "layer_norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  ours = nnx.eval_shape(lambda: T5Encoder(cfg, rngs=nnx.Rngs(0)))
  torch_port.load_state_dict(ours, ref.state_dict(), RULES)
  return cfg, ref, ours



def test_key_map_coverage_and_round_trip(models):
  _, ref, ours = models
  sd = ref.state_dict()
  torch_port.assert_rules_cover(RULES, set(sd), flax_params(ours))
  for key, tensor in sd.items():
    path, transform = KEYMAP.hf_to_flax(key)
    hf_key, back = KEYMAP.flax_to_hf(path)
    # The tied input embedding renders as shared.weight.
    assert hf_key == ("shared.weight" if key == "encoder.embed_tokens.weight" else key)
    assert np.array_equal(back.to_hf(transform.to_flax(tensor.numpy())), tensor.numpy())


def test_encoder_outputs(models):
  cfg, ref, ours = models
  # Lengths past relative_attention_max_distance (20) reach the log-spaced and clipped buckets.
  rng = np.random.default_rng(0)
  ids = rng.integers(0, cfg.vocab_size, (3, 45))
  mask = np.ones_like(ids)
  mask[1, 30:] = 0
  mask[2, 3:] = 0
  with torch.no_grad():
    want = ref(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
  got = nnx.jit(lambda m, i, a: m(i, a))(ours, jnp.asarray(ids), jnp.asarray(mask))
  assert got.shape == (3, 45, cfg.d_model) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=ATOL)


def test_relative_position_buckets_match_reference():
  for n, buckets, dist in ((300, 32, 128), (64, 8, 20)):
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    want = T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=buckets,
                                                 max_distance=dist).numpy()
    assert np.array_equal(relative_position_buckets(n, buckets, dist), want)


def test_full_size_param_count_and_coverage():
  cfg = T5EncoderConfig.full()
  ref = torch_model(cfg, "meta")
  params = flax_params(nnx.eval_shape(lambda: T5Encoder(cfg, rngs=nnx.Rngs(0))))
  # parameters() counts the tied embedding once, like our single table.
  assert sum(int(np.prod(v.shape)) for v in params.values()) == sum(p.numel() for p in ref.parameters())
  sd = ref.state_dict()
  torch_port.assert_rules_cover(RULES, set(sd), params)
  for key, tensor in sd.items():
    path, transform = KEYMAP.hf_to_flax(key)
    assert transform.flax_shape(tuple(tensor.shape)) == tuple(params[path].shape), key


def test_config():
  for cfg in (*CONFIGS.values(), T5EncoderConfig.full()):
    assert T5EncoderConfig.from_hf(cfg.to_hf()) == cfg
    assert T5EncoderConfig.from_hf(T5Config(**cfg.to_hf()).to_dict()) == cfg
  assert T5EncoderConfig.full().activation == "gelu_new"
  with pytest.raises(ValueError, match="feed_forward_proj"):
    T5EncoderConfig(feed_forward_proj="gated-swish-x")


def test_bad_inputs(models):
  _, _, ours = models
  with pytest.raises(ValueError, match=r"input_ids must be \[B, L\]"):
    ours(jnp.zeros((5,), jnp.int32))
  with pytest.raises(ValueError, match="attention_mask shape"):
    ours(jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 4), jnp.int32))
