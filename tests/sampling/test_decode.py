"""DiT denoising + VAE decode against diffusers' GlmImagePipeline (float32, tiny random models).

Given the same initial latents, prior tokens and glyph embeddings, the denoised latents match within
1e-4 and the decoded images within 1e-4 before quantisation (uint8 within 1 level).
"""

import glmrl  # noqa: F401

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL as TorchVAE
from diffusers import FlowMatchEulerDiscreteScheduler, GlmImagePipeline, GlmImageTransformer2DModel
from flax import nnx

from checkpoints_convert.maps import dit as dit_map
from checkpoints_convert.maps import vae as vae_map
from glmrl.models.dit import DiTConfig, GlmImageDiT
from glmrl.models.vae import AutoencoderKL, VAEConfig
from glmrl.sampling import decode, scheduler
from tests import torch_port

H = W = 64
STEPS = 3
GUIDANCE = 1.5


@pytest.fixture(scope="module")
def setup():
  torch.manual_seed(0)
  dit_cfg = DiTConfig.tiny()
  vae_cfg = VAEConfig.tiny(block_out_channels=(8, 8, 16, 16), latent_channels=dit_cfg.in_channels)
  t_dit = GlmImageTransformer2DModel.from_config(dit_cfg.to_hf()).eval()
  t_vae = TorchVAE(**{k: v for k, v in vae_cfg.to_hf().items() if not k.startswith("_")}).eval()
  with torch.no_grad():  # zero-initialised projections would hide most of the network
    for p in t_dit.parameters():
      p.add_(0.05 * torch.randn_like(p))
  sched_cfg = scheduler.SchedulerConfig.full()
  t_sched = FlowMatchEulerDiscreteScheduler.from_config(sched_cfg.to_hf())
  pipe = GlmImagePipeline(tokenizer=None, processor=None, text_encoder=None, vision_language_encoder=None,
                          vae=t_vae, transformer=t_dit, scheduler=t_sched)
  dit = torch_port.port(t_dit, GlmImageDiT, dit_cfg, dit_map.RULES)
  vae = torch_port.port(t_vae, AutoencoderKL, vae_cfg, vae_map.RULES)
  return pipe, dit, vae, dit_cfg, vae_cfg, sched_cfg


def test_denoise_and_decode_match_pipeline(setup):
  pipe, dit, vae, dit_cfg, vae_cfg, sched_cfg = setup
  rng = np.random.default_rng(0)
  b, c, h, w = 2, dit_cfg.in_channels, H // 8, W // 8
  latents = rng.normal(size=(b, c, h, w)).astype(np.float32)
  grid = rng.integers(0, dit_cfg.prior_vq_quantizer_codebook_size, size=(b, H // 32, W // 32))
  prior = np.array(decode.upsample_prior_tokens(jnp.asarray(grid)))
  glyph = rng.normal(size=(b, 5, dit_cfg.text_embed_dim)).astype(np.float32)
  neg = rng.normal(size=(b, 5, dit_cfg.text_embed_dim)).astype(np.float32)

  kw = dict(prompt_embeds=torch.from_numpy(glyph), negative_prompt_embeds=torch.from_numpy(neg),
            prior_token_ids=torch.from_numpy(prior), latents=torch.from_numpy(latents), height=H, width=W,
            num_inference_steps=STEPS, guidance_scale=GUIDANCE)
  with torch.no_grad():
    ref_latents = pipe(output_type="latent", **kw).images.numpy()
    ref_images = pipe(output_type="pt", **kw).images.numpy()  # [B, 3, H, W] in [0, 1]

  sched = scheduler.glm_image_schedule(STEPS, H, W, sched_cfg)
  ones = jnp.ones((b, 5), bool)
  cond = decode.Conditioning(jnp.asarray(prior), jnp.asarray(glyph), ones, jnp.asarray(neg), ones)
  dit_def, dit_state = nnx.split(dit)
  vae_def, vae_state = nnx.split(vae)
  target = jnp.tile(jnp.array([[H, W]], jnp.float32), (b, 1))
  images, out_latents = decode.denoise_and_decode(
      dit_def, dit_state, vae_def, vae_state, cond, jnp.asarray(latents), jnp.asarray(sched.model_timesteps),
      jnp.asarray(sched.sigmas), GUIDANCE, target, jnp.zeros((b, 2)))

  assert np.abs(ref_latents - latents).max() > 0.1  # the DiT moved the latents
  np.testing.assert_allclose(out_latents, ref_latents, atol=1e-4)
  assert images.dtype == jnp.uint8 and images.shape == (b, H, W, 3)
  ref_uint8 = np.round(np.transpose(ref_images, (0, 2, 3, 1)) * 255)
  assert np.abs(np.asarray(images, np.int32) - ref_uint8).max() <= 1


def test_upsample_prior_tokens_is_nearest_x2():
  grid = jnp.array([[[1, 2], [3, 4]]])
  np.testing.assert_array_equal(
      decode.upsample_prior_tokens(grid),
      [[1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4]])
