"""The decoder (Flow-GRPO) update on a tiny random DiT with DiT LoRA, float32.

The trajectory comes from the sampler itself (`decode.denoise_and_decode` with an SDE window). Checked:
the first update's ratio is exactly 1 at every trained step and its log-probs are the sampler's (1e-5);
the gradient accumulated over micro-batches x timesteps equals the gradient of an independently written
whole-batch loss (rtol 1e-4) and extrapolated central finite differences (rtol 2e-2, float32), with the plain
ratio and with GRPO-Guard's; the KL against adapters-off is 0 (1e-9) with B = 0 and otherwise the float64
mean((mu - mu_ref)^2) / (2 s^2) (1e-5).
"""

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from glmrl.grpo import flow
from glmrl.models import lora as lora_lib
from glmrl.models import glm_image
from glmrl.models.vae import VAEConfig
from glmrl.sampling import decode, scheduler
from glmrl.policy import flow_grpo as decoder_policy
from tests.policy.tiny_dit import adapted_dit

H = W = 64
STEPS, START, SIZE = 4, 1, 2
GUIDANCE, NOISE = 3.0, 0.7
B = 4


def spec(**kw):
  base = dict(noise_level=NOISE, guidance_scale=GUIDANCE, clip_range=1e-4, adv_clip_max=5.0, beta=0.0,
              micro_batches=1, reference="adapters_off")
  return decoder_policy.FlowSpec(**{**base, **kw})


@pytest.fixture(scope="module")
def setup():
  dit_cfg, graphdef, adapters, base, cond, rng = adapted_dit(B, H, W)
  vae_cfg = VAEConfig.tiny(block_out_channels=(8, 8, 16, 16), latent_channels=dit_cfg.in_channels)
  vae = nnx.merge(*glm_image.build("vae", vae_cfg, seed=1))  # AutoencoderKL(vae_cfg, rngs=nnx.Rngs(1))'s, jitted
  sched = scheduler.glm_image_schedule(STEPS, H, W, scheduler.SchedulerConfig.full())
  timesteps, sigmas = jnp.asarray(sched.model_timesteps), jnp.asarray(sched.sigmas)
  latents = jnp.asarray(rng.normal(size=(B, dit_cfg.in_channels, H // 8, W // 8)), jnp.float32)
  size, crop = jnp.tile(jnp.array([[H, W]], jnp.float32), (B, 1)), jnp.zeros((B, 2))
  vae_def, vae_state = nnx.split(vae)
  _, _, traj = decode.denoise_and_decode(graphdef, (adapters, base), vae_def, vae_state, cond, latents, timesteps,
                                         sigmas, GUIDANCE, size, crop, None, decode.SdeWindow(NOISE, SIZE),
                                         jax.random.split(jax.random.key(4), B), START)
  batch_first = lambda x: jnp.swapaxes(x, 0, 1)
  rollout = decoder_policy.FlowRollout(
      cond=cond, target_size=size, crop=crop, latents_before=batch_first(traj.latents_before),
      latents_after=batch_first(traj.latents_after), sampler_logp=batch_first(traj.sampler_logp),
      old_logp=jnp.full((B, SIZE), jnp.nan), advantages=jnp.array([1.5, -0.5, -1.0, 8.0]),
      mask=jnp.array([[1.0] * SIZE, [1.0] * SIZE, [0.0] * SIZE, [1.0] * SIZE]))
  window = decoder_policy.Window.at(timesteps, sigmas, START, SIZE)
  return graphdef, adapters, base, rollout, window


def accumulate(setup, first=True, **kw):
  graphdef, adapters, base, rollout, window = setup
  return decoder_policy.accumulate_gradients(graphdef, adapters, base, decoder_policy.FlowBatch(rollout, window), None,
                                             first, spec=spec(**kw))


def test_first_update_ratio_is_exactly_one_and_logprobs_are_the_samplers(setup):
  graphdef, adapters, base, rollout, window = setup
  tx = optax.adam(1e-3)
  batch = decoder_policy.FlowBatch(rollout, window)
  new, _, metrics, (old, old_mean) = decoder_policy.update(graphdef, adapters, base, tx.init(adapters), batch, None,
                                                           True, spec=spec(), tx=tx, schedule=lambda _: 1e-3)
  assert float(metrics["ratio/min"]) == float(metrics["ratio/max"]) == 1.0
  assert float(metrics["skipped"]) == 0.0
  assert old.shape == (B, SIZE) and old_mean is None
  np.testing.assert_allclose(np.asarray(old), np.asarray(rollout.sampler_logp), rtol=1e-5, atol=1e-5)
  # Each trained step individually: exp(logp - stop_gradient(logp)) == 1 bitwise.
  for w in range(SIZE):
    logp, _, _ = decoder_policy.step_logprob(graphdef, adapters, base, rollout, window, w, spec())
    assert np.all(np.exp(np.asarray(logp) - np.asarray(logp)) == 1.0)
  assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(adapters)))


def direct_loss(adapters, setup, old_logp, clip, beta, old_mean=None):
  """The whole batch's loss written out step by step: mean over valid (sample, step) of the clipped surrogate
  + beta KL, the reference being the same DiT with every lora_b zeroed. With old_mean [B, W, C, h, w], the ratio
  is GRPO-Guard's as Flow-Factory writes it: exp((logp - old) s + mean((mu - old_mu)^2) / (2 s))."""
  graphdef, _, base, rollout, window = setup
  off = lora_lib.adapters_off(adapters)
  terms, count = 0.0, 0.0
  for w in range(SIZE):
    def mean(p):
      dit = nnx.merge(graphdef, p, base, copy=True)
      x = rollout.latents_before[:, w]
      v = decode.guided_velocity(dit, rollout.cond, x, window.timesteps[w], GUIDANCE, rollout.target_size,
                                 rollout.crop)
      return flow.sde_step_mean(x, v, window.sigmas[w], window.sigmas_next[w], NOISE)
    mu, std = mean(adapters)
    mu_ref, _ = mean(off)
    logp = flow.sde_logprob(rollout.latents_after[:, w], mu, std)
    r = jnp.exp(logp - old_logp[:, w])
    if old_mean is not None:
      mse = jnp.mean(jnp.square(mu - old_mean[:, w]), axis=(1, 2, 3))
      r = jnp.exp((logp - old_logp[:, w]) * std + mse / (2 * std))
    a = jnp.clip(rollout.advantages, -5.0, 5.0)
    term = jnp.maximum(-a * r, -a * jnp.clip(r, 1 - clip, 1 + clip))
    term = term + beta * jnp.mean(jnp.square(mu - jax.lax.stop_gradient(mu_ref)), axis=(1, 2, 3)) / (2 * std ** 2)
    terms = terms + jnp.sum(term * rollout.mask[:, w])
    count = count + jnp.sum(rollout.mask[:, w])
  return terms / count


@pytest.mark.parametrize("ratio_norm", [False, True])
def test_accumulated_gradient_equals_the_whole_batch_gradient_and_finite_differences(setup, ratio_norm):
  graphdef, adapters, base, rollout, window = setup
  # Off-policy old log-probs (a later iteration) and no clipping, so every term has a gradient; KL on.
  rng = np.random.default_rng(1)
  old = rollout.sampler_logp + 1e-3 * jnp.asarray(rng.normal(size=(B, SIZE)), jnp.float32)
  old_mean = None
  if ratio_norm:  # GRPO-Guard: an old mean near the latents the steps went to
    old_mean = rollout.latents_after + 1e-2 * jnp.asarray(rng.normal(size=rollout.latents_after.shape), jnp.float32)
  data = (graphdef, adapters, base, rollout.replace(old_logp=old, old_mean=old_mean), window)
  grads_1, stats, _ = accumulate(data, first=False, clip_range=0.5, beta=0.5, ratio_norm=ratio_norm)
  grads_2, stats_2, _ = accumulate(data, first=False, clip_range=0.5, beta=0.5, micro_batches=2,
                                   ratio_norm=ratio_norm)
  grads = jax.tree.map(lambda g: g / stats["denominator"], grads_1)
  loss = jax.jit(lambda p: direct_loss(p, data, old, 0.5, 0.5, old_mean))
  want = jax.jit(jax.grad(loss))(adapters)
  for g, g2, w in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_2), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g2) / float(stats_2["denominator"]), np.asarray(w), rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(float(stats["numerator"] / stats["denominator"]), float(loss(adapters)), rtol=1e-5)
  # Central finite differences along a random direction of the adapters, h = 1e-2 and 5e-3, Richardson-extrapolated
  # (their h^2 terms cancel: GRPO-Guard's loss is curved enough for them to show at h = 1e-2).
  direction = jax.tree.map(lambda x: jax.random.normal(jax.random.key(9), x.shape), adapters)
  shifted = lambda h: jax.tree.map(lambda p, d: p + h * d, adapters, direction)
  central = lambda h: (loss(shifted(h)) - loss(shifted(-h))) / (2 * h)
  fd = (4 * central(5e-3) - central(1e-2)) / 3
  analytic = sum(jnp.sum(g * d) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(direction)))
  np.testing.assert_allclose(float(analytic), float(fd), rtol=2e-2)


def test_kl_is_against_the_adapters_off_dit(setup):
  graphdef, adapters, base, rollout, window = setup
  zero_b = lora_lib.adapters_off(adapters)
  _, stats, _ = accumulate((graphdef, zero_b, base, rollout, window), beta=1.0)
  # Zero up to rounding: the policy's forward runs inside jax.grad, the reference's outside (other fusions).
  assert abs(float(stats["kl_mean"])) < 1e-9
  _, stats, _ = accumulate(setup, beta=1.0)
  kl_mean = float(stats["kl_mean"] / stats["denominator"])
  want, count = 0.0, 0.0
  for w in range(SIZE):
    mus = []
    for p in (adapters, zero_b):
      mu, std = decoder_policy.step_mean(graphdef, p, base, rollout, window, w, spec())
      mus.append(np.asarray(mu, np.float64))
    per = np.mean((mus[0] - mus[1]) ** 2, axis=(1, 2, 3)) / (2 * float(std) ** 2)
    want += float(np.sum(per * np.asarray(rollout.mask[:, w])))
    count += float(np.sum(rollout.mask[:, w]))
  assert want / count > 1e-3  # the adapters moved the means
  np.testing.assert_allclose(kl_mean, want / count, rtol=1e-5)


def test_guard_first_update_ratio_is_exactly_one_and_keeps_the_step_means(setup):
  """GRPO-Guard on-policy: old = stop_gradient(new) for the log-prob and the mean, so the normalised log-ratio is 0
  and the ratio 1 exactly; the update returns the means for the later iterations."""
  graphdef, adapters, base, rollout, window = setup
  tx = optax.adam(1e-3)
  rollout = rollout.replace(old_mean=jnp.full_like(rollout.latents_after, jnp.nan))
  _, _, metrics, (old, old_mean) = decoder_policy.update(
      graphdef, adapters, base, tx.init(adapters), decoder_policy.FlowBatch(rollout, window), None, True,
      spec=spec(ratio_norm=True), tx=tx, schedule=lambda _: 1e-3)
  assert float(metrics["ratio/min"]) == float(metrics["ratio/max"]) == 1.0
  assert float(metrics["skipped"]) == 0.0
  assert old_mean.shape == rollout.latents_after.shape
  for w in range(SIZE):
    mu, _ = decoder_policy.step_mean(graphdef, adapters, base, rollout, window, w, spec())
    np.testing.assert_allclose(np.asarray(old_mean[:, w]), np.asarray(mu), rtol=1e-5, atol=1e-6)
