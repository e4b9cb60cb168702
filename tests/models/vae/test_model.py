"""VAE parity with diffusers' AutoencoderKL (float32, tiny random config, weights via the key map).

Tolerance: 1e-4 max abs on encoder mean / log-variance, decoded images and normalised latents.
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL as TorchAutoencoderKL
from flax import nnx

from checkpoints_convert.maps.vae import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.models.vae import AutoencoderKL, VAEConfig, denormalize_latents, normalize_latents
from tests import torch_port

ATOL = 1e-4
KEYMAP = KeyMap(RULES)


def torch_model(cfg: VAEConfig, device=None):
  kwargs = {k: v for k, v in cfg.to_hf().items() if not k.startswith("_")}
  if device == "meta":
    with torch.device("meta"):
      return TorchAutoencoderKL(**kwargs)
  return TorchAutoencoderKL(**kwargs).eval()


def flax_params(model) -> dict:
  return {flax_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}




@pytest.fixture(scope="module")
def models():
  cfg = VAEConfig.tiny()
  torch.manual_seed(0)
  ref = torch_model(cfg)
  with torch.no_grad():  # norms initialise to (1, 0); randomise them so the map is exercised
    for name, p in ref.named_parameters():
      if "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  # Built abstractly and filled from the reference: eager random init costs seconds of compiles.
  ours = nnx.eval_shape(lambda: AutoencoderKL(cfg, rngs=nnx.Rngs(0)))
  torch_port.load_state_dict(ours, ref.state_dict(), RULES)
  return cfg, ref, ours


def nchw(x):
  return np.asarray(x).transpose(0, 3, 1, 2)


def nhwc(x):
  return jnp.asarray(np.asarray(x).transpose(0, 2, 3, 1))



def test_key_map_coverage_tiny(models):
  _, ref, ours = models
  torch_port.assert_rules_cover(RULES, set(ref.state_dict()), flax_params(ours))


def test_key_map_round_trip_bit_exact(models):
  _, ref, _ = models
  for key, tensor in ref.state_dict().items():
    path, transform = KEYMAP.hf_to_flax(key)
    hf_key, back = KEYMAP.flax_to_hf(path)
    a = tensor.numpy()
    assert hf_key == key
    assert np.array_equal(back.to_hf(transform.to_flax(a)), a)


def test_encode(models):
  cfg, ref, ours = models
  x = torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 24)).astype(np.float32))
  with torch.no_grad():
    dist = ref.encode(x).latent_dist
  encode = nnx.jit(lambda m, x: m.encode(x))
  out = encode(ours, nhwc(x))
  assert out.mean.shape == (2, 32 // cfg.scale_factor, 24 // cfg.scale_factor, 4)
  np.testing.assert_allclose(nchw(out.mean), dist.mean.numpy(), rtol=0, atol=ATOL)
  np.testing.assert_allclose(nchw(out.logvar), dist.logvar.numpy(), rtol=0, atol=ATOL)
  np.testing.assert_allclose(nchw(out.std), dist.std.numpy(), rtol=0, atol=ATOL)
  # Sampling is mean + std * N(0, 1) drawn from the key.
  key = jax.random.key(3)
  eps = jax.random.normal(key, out.mean.shape)
  np.testing.assert_allclose(np.asarray(out.sample(key)), np.asarray(out.mean + out.std * eps), rtol=0, atol=1e-6)
  # The pipeline's condition latents: (mode - latents_mean) / latents_std.
  mean = torch.tensor(cfg.latents_mean).view(1, cfg.latent_channels, 1, 1)
  std = torch.tensor(cfg.latents_std).view(1, cfg.latent_channels, 1, 1)
  np.testing.assert_allclose(nchw(normalize_latents(out.mean, cfg)), ((dist.mode() - mean) / std).numpy(),
                             rtol=0, atol=ATOL)


def test_decode(models):
  cfg, ref, ours = models
  z = torch.from_numpy(np.random.default_rng(1).standard_normal((2, 4, 6, 5)).astype(np.float32))
  mean = torch.tensor(cfg.latents_mean).view(1, cfg.latent_channels, 1, 1)
  std = torch.tensor(cfg.latents_std).view(1, cfg.latent_channels, 1, 1)
  with torch.no_grad():
    img = ref.decode(z * std + mean, return_dict=False)[0]
  out = nnx.jit(lambda m, z: m.decode_normalized(z))(ours, nhwc(z))
  assert out.shape == (2, 12, 10, 3)
  np.testing.assert_allclose(nchw(out), img.numpy(), rtol=0, atol=ATOL)


def test_normalization_helpers():
  cfg = VAEConfig.tiny()
  z = jnp.asarray(np.random.default_rng(2).standard_normal((2, 4, 3, 5)).astype(np.float32))
  back = denormalize_latents(normalize_latents(z, cfg, channel_axis=1), cfg, channel_axis=1)
  np.testing.assert_allclose(np.asarray(back), np.asarray(z), rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match="channels on axis -1"):
    normalize_latents(z, cfg)
  with pytest.raises(ValueError, match="latents_mean"):
    normalize_latents(z, VAEConfig.tiny(latents_mean=None, latents_std=None), channel_axis=1)


def test_bad_inputs(models):
  _, _, ours = models
  with pytest.raises(ValueError, match=r"images must be \[B, H, W, 3\]"):
    ours.encode(jnp.zeros((1, 3, 16, 16)))
  with pytest.raises(ValueError, match=r"latents must be \[B, H, W, 4\]"):
    ours.decode(jnp.zeros((4, 4, 4)))
  with pytest.raises(ValueError, match="latents_mean has 3 entries"):
    VAEConfig.tiny(latents_mean=(0.0, 0.0, 0.0))
  with pytest.raises(ValueError, match="up_block_types"):
    VAEConfig.from_hf({**VAEConfig.tiny().to_hf(), "up_block_types": ["AttnUpDecoderBlock2D"] * 2})


def test_config_round_trip():
  for cfg in (VAEConfig.tiny(), VAEConfig.full()):
    assert VAEConfig.from_hf(cfg.to_hf()) == cfg
    assert VAEConfig.from_hf(dict(torch_model(cfg, "meta").config)) == cfg
  assert VAEConfig.full().scale_factor == 8 and VAEConfig.full().latent_channels == 16


def test_full_size_param_count_and_coverage():
  cfg = VAEConfig.full()
  ref = torch_model(cfg, "meta")
  abstract = nnx.eval_shape(lambda: AutoencoderKL(cfg, rngs=nnx.Rngs(0)))
  params = flax_params(abstract)
  assert sum(int(np.prod(v.shape)) for v in params.values()) == sum(p.numel() for p in ref.parameters())
  torch_port.assert_rules_cover(RULES, set(ref.state_dict()), params)
  for key, tensor in ref.state_dict().items():
    path, transform = KEYMAP.hf_to_flax(key)
    assert transform.flax_shape(tuple(tensor.shape)) == tuple(params[path].shape), key
