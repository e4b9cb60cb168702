"""Flow-GRPO's SDE window in the denoising loop (float32, tiny random DiT and VAE).

noise_level 0 reproduces the ODE's latents and images bit for bit; with noise the window's recorded steps
are Gaussian steps of `glmrl.grpo.flow` whose log-probs a separate recomputation of the same guided
velocity reproduces (1e-5, two compiled programs); steps outside the window are the ODE's.
"""

import glmrl  # noqa: F401

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from glmrl.grpo import flow
from glmrl.models import glm_image
from glmrl.models.dit import DiTConfig
from glmrl.models.vae import VAEConfig
from glmrl.sampling import decode, scheduler

H = W = 64
STEPS = 4
GUIDANCE = 1.5


@pytest.fixture(scope="module")
def inputs():
  dit_cfg = DiTConfig.tiny()
  vae_cfg = VAEConfig.tiny(block_out_channels=(8, 8, 16, 16), latent_channels=dit_cfg.in_channels)
  # GlmImageDiT(dit_cfg, rngs=nnx.Rngs(0)) and AutoencoderKL(vae_cfg, rngs=nnx.Rngs(1)), by the jitted init (one
  # program each, not one per operation and shape), the DiT's weights moved off their initial values.
  dit_def, dit_state = glm_image.build("dit", dit_cfg, seed=0)
  dit_state = jax.jit(lambda s: jax.tree.map(
      lambda x: x + 0.05 * jax.random.normal(jax.random.key(2), x.shape, x.dtype), s))(dit_state)
  dit = nnx.merge(dit_def, dit_state)
  vae_def, vae_state = glm_image.build("vae", vae_cfg, seed=1)
  rng = np.random.default_rng(0)
  b = 2
  grid = rng.integers(0, dit_cfg.prior_vq_quantizer_codebook_size, size=(b, H // 32, W // 32))
  glyph = jnp.asarray(rng.normal(size=(b, 5, dit_cfg.text_embed_dim)), jnp.float32)
  ones = jnp.ones((b, 5), bool)
  cond = decode.Conditioning(decode.upsample_prior_tokens(jnp.asarray(grid)), glyph, ones, -glyph, ones)
  sched = scheduler.glm_image_schedule(STEPS, H, W, scheduler.SchedulerConfig.full())
  latents = jnp.asarray(rng.normal(size=(b, dit_cfg.in_channels, H // 8, W // 8)), jnp.float32)
  args = (dit_def, dit_state, vae_def, vae_state, cond, latents, jnp.asarray(sched.model_timesteps),
          jnp.asarray(sched.sigmas), GUIDANCE, jnp.tile(jnp.array([[H, W]], jnp.float32), (b, 1)), jnp.zeros((b, 2)))
  return args, dit, cond, sched, jax.random.split(jax.random.key(3), b)


def test_noise_level_zero_is_the_ode_bit_for_bit(inputs):
  args, _, _, _, keys = inputs
  images, latents = decode.denoise_and_decode(*args)
  sde_images, sde_latents, trajectory = decode.denoise_and_decode(
      *args, None, decode.SdeWindow(noise_level=0.0, size=2), keys, 1)
  np.testing.assert_array_equal(np.asarray(sde_latents), np.asarray(latents))
  np.testing.assert_array_equal(np.asarray(sde_images), np.asarray(images))
  assert trajectory.latents_before.shape == (2,) + latents.shape
  assert np.all(np.isnan(np.asarray(trajectory.sampler_logp)))  # a deterministic step has no density


def test_the_window_holds_the_dit_once_in_the_program(inputs):
  """The window's steps differ from the ODE's only in the update after the same guided velocity: the denoising
  loop is one loop of one DiT with or without a window (a loop before, in and after the window would put the DiT
  into the program three times, and the compile time with it, at any size)."""
  args, _, _, _, keys = inputs
  dots = lambda *sde: decode.denoise_and_decode.lower(*args, *sde).as_text().count("stablehlo.dot_general")
  assert dots(None, decode.SdeWindow(noise_level=0.7, size=2), keys, 1) == dots() > 0


def test_window_steps_are_gaussian_steps_whose_logprobs_recompute(inputs):
  args, dit, cond, sched, keys = inputs
  window, start = decode.SdeWindow(noise_level=0.7, size=2), 1
  _, latents, trajectory = decode.denoise_and_decode(*args, None, window, keys, start)
  _, ode_latents = decode.denoise_and_decode(*args)
  assert np.abs(np.asarray(latents) - np.asarray(ode_latents)).max() > 1e-3  # the noise moved the result
  b = latents.shape[0]
  target, crop = args[9], args[10]

  @jax.jit
  def step_logprob(x, x_next, i):
    t = jnp.asarray(sched.model_timesteps)[i]
    v_c = dit(x, cond.prior_ids_BxX, cond.glyph_BxSxD, jnp.full((b,), t), target, crop,
              prior_token_drop=False, glyph_mask=cond.glyph_mask_BxS)
    v_u = dit(x, cond.prior_ids_BxX, cond.neg_glyph_BxSxD, jnp.full((b,), t), target, crop,
              prior_token_drop=jnp.ones((b, 1), bool), glyph_mask=cond.neg_glyph_mask_BxS)
    v = v_u.astype(jnp.float32) + GUIDANCE * (v_c.astype(jnp.float32) - v_u.astype(jnp.float32))
    sigmas = jnp.asarray(sched.sigmas)
    mu, std = flow.sde_step_mean(x, v, sigmas[i], sigmas[i + 1], window.noise_level)
    return flow.sde_logprob(x_next, mu, std)

  logp = np.asarray(trajectory.sampler_logp)
  assert np.all(np.isfinite(logp))
  for w in range(window.size):
    again = step_logprob(trajectory.latents_before[w], trajectory.latents_after[w], start + w)
    np.testing.assert_allclose(np.asarray(again), logp[w], rtol=1e-5, atol=1e-5)
  # The window's steps chain: x_{t+1} of one step is x_t of the next.
  np.testing.assert_array_equal(np.asarray(trajectory.latents_after[0]), np.asarray(trajectory.latents_before[1]))


def test_rematerialised_dit_samples_as_the_plain_one(inputs):
  """The decoder policy turns on the DiT's per-block remat (its update differentiates the DiT); the sampling loop
  runs the same DiT forward with it (its blocks' Variables belong to the loop body's trace)."""
  args, dit, _, _, keys = inputs
  dit_state = args[1]
  remat_def, _ = glm_image.abstract_model("dit", dataclasses.replace(dit.cfg, remat=True))
  window = decode.SdeWindow(noise_level=0.7, size=2)
  plain = decode.denoise_and_decode(*args, None, window, keys, 1)
  remat = decode.denoise_and_decode(remat_def, dit_state, *args[2:], None, window, keys, 1)
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(remat)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-5, atol=1e-5)
