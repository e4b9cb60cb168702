"""DiffusionNFT's and AWM's losses, and Flow-CPS's step, against float64 numpy re-implementations of the
published formulas (DiffusionNFT arXiv:2509.16117 / scripts/train_nft_sd3.py; AWM arXiv:2509.25050; Flow-CPS
as in Flow-GRPO's sd3_sde_with_logprob.py), and their gradients against finite differences."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.grpo import flow, matching

B, SHAPE = 3, (2, 4, 4)


def draw(seed):
  rng = np.random.default_rng(seed)
  x0, eps, v, v_old = (rng.standard_normal((B, *SHAPE)) for _ in range(4))
  sigma = rng.uniform(0.05, 1.0, B)
  adv = rng.standard_normal(B) * 3.0
  return x0, eps, v, v_old, sigma, adv


def ref_nft(v, v_old, x0, eps, sigma, adv, beta, clip):
  """Per sample, float64, from the paper's definitions (no shared code)."""
  out = []
  for b in range(B):
    s = sigma[b]
    x_t = (1 - s) * x0[b] + s * eps[b]
    r = min(max(min(max(adv[b], -clip), clip) / clip / 2 + 0.5, 0.0), 1.0)
    v_pos = beta * v[b] + (1 - beta) * v_old[b]
    v_neg = (1 + beta) * v_old[b] - beta * v[b]
    terms = []
    for vv in (v_pos, v_neg):
      e = (x_t - s * vv) - x0[b]
      terms.append(np.mean(e ** 2) / max(np.mean(np.abs(e)), 1e-5))
    out.append(clip * (r * terms[0] + (1 - r) * terms[1]) / beta)
  return np.array(out)


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_nft_loss_matches_float64_reference(beta):
  x0, eps, v, v_old, sigma, adv = draw(0)
  f = lambda a: jnp.asarray(a, jnp.float32)
  x_t = matching.noised(f(x0), f(eps), f(sigma))
  got = matching.nft_loss(f(v), f(v_old), f(x0), x_t, f(sigma), matching.optimality(f(adv), 5.0), beta=beta,
                          scale=5.0)
  np.testing.assert_allclose(np.asarray(got), ref_nft(v, v_old, x0, eps, sigma, adv, beta, 5.0), rtol=1e-5)


def test_nft_at_the_old_policy_pulls_towards_the_good_samples():
  """With v = v_old the positive and negative policies coincide; the gradient is then r - 1/2 times the
  plain x0-regression gradient: it descends for r > 1/2 and ascends for r < 1/2."""
  x0, eps, v, _, sigma, _ = draw(1)
  f = lambda a: jnp.asarray(a, jnp.float32)
  x_t = matching.noised(f(x0), f(eps), f(sigma))
  loss = lambda vv, r: jnp.sum(matching.nft_loss(vv, f(v), f(x0), x_t, f(sigma), r, beta=1.0, scale=1.0))
  fm = lambda vv: jnp.sum(jnp.mean(jnp.square((x_t - f(sigma)[:, None, None, None] * vv) - f(x0)), axis=(1, 2, 3))
                          / jax.lax.stop_gradient(jnp.mean(jnp.abs((x_t - f(sigma)[:, None, None, None] * vv)
                                                                   - f(x0)), axis=(1, 2, 3))))
  for r in (0.0, 0.25, 0.5, 1.0):
    g = jax.grad(loss)(f(v), jnp.full((B,), r))
    np.testing.assert_allclose(np.asarray(g), (2 * r - 1) * np.asarray(jax.grad(fm)(f(v))), atol=1e-6)


def test_nft_gradient_matches_finite_differences():
  x0, eps, v, v_old, sigma, adv = draw(2)
  x_t = (1 - sigma)[:, None, None, None] * x0 + sigma[:, None, None, None] * eps
  r = np.clip(np.clip(adv, -5, 5) / 10 + 0.5, 0, 1)
  f = lambda a: jnp.asarray(a, jnp.float32)
  direction = np.random.default_rng(3).standard_normal(v.shape)
  loss = lambda vv: jnp.sum(matching.nft_loss(vv, f(v_old), f(x0), f(x_t), f(sigma), f(r), beta=0.5, scale=5.0))
  g = jax.grad(loss)(f(v))
  # The adaptive weights are held constant (stop_gradient): the check differentiates with them frozen, and
  # the loss is then quadratic in v, so the central difference is exact up to rounding for any step. The
  # loss computes in float32 (as the update does): rtol 1e-5 is float32's rounding of a 96-term sum.
  h = 1e-3
  frozen = _nft_frozen_weights(v, v_old, x0, x_t, sigma, r, 0.5)
  num = (frozen(v + h * direction) - frozen(v - h * direction)) / (2 * h)
  np.testing.assert_allclose(float(jnp.sum(g * direction)), num, rtol=1e-5)


def _nft_frozen_weights(v, v_old, x0, x_t, sigma, r, beta):
  """The float64 NFT loss with the adaptive weights taken at `v` and then held fixed."""
  s = sigma[:, None, None, None]
  w = []
  for vv in (beta * v + (1 - beta) * v_old, (1 + beta) * v_old - beta * v):
    w.append(np.maximum(np.mean(np.abs((x_t - s * vv) - x0), axis=(1, 2, 3)), 1e-5))

  def loss(u):
    pos, neg = beta * u + (1 - beta) * v_old, (1 + beta) * v_old - beta * u
    lp = np.mean(((x_t - s * pos) - x0) ** 2, axis=(1, 2, 3)) / w[0]
    ln = np.mean(((x_t - s * neg) - x0) ** 2, axis=(1, 2, 3)) / w[1]
    return float(np.sum(5.0 * (r * lp + (1 - r) * ln) / beta))
  return loss


@pytest.mark.parametrize("weighting", ["uniform", "t", "t2"])  # ghuber: its own test below
def test_awm_logprob_matches_float64_reference(weighting):
  x0, eps, v, _, sigma, _ = draw(4)
  target = eps - x0
  w = {"uniform": np.ones(B), "t": sigma, "t2": sigma ** 2}[weighting]
  want = -w * np.mean((v - target) ** 2, axis=(1, 2, 3))
  f = lambda a: jnp.asarray(a, jnp.float32)
  got = matching.awm_logprob(f(v), matching.velocity_target(f(x0), f(eps)), f(sigma), weighting)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_awm_gradient_matches_finite_differences():
  x0, eps, v, _, sigma, _ = draw(5)
  direction = np.random.default_rng(6).standard_normal(v.shape)
  f = lambda a: jnp.asarray(a, jnp.float32)
  loss = lambda vv: jnp.sum(matching.awm_logprob(vv, f(eps - x0), f(sigma), "t"))
  g = float(jnp.sum(jax.grad(loss)(f(v)) * direction))
  ref = lambda u: float(np.sum(-sigma * np.mean((u - (eps - x0)) ** 2, axis=(1, 2, 3))))
  h = 1e-3  # quadratic: the central difference is exact up to rounding; float32 gradient: rtol 1e-5
  np.testing.assert_allclose(g, (ref(v + h * direction) - ref(v - h * direction)) / (2 * h), rtol=1e-5)


def test_noised_and_target_are_the_flow_the_sampler_integrates():
  """x_sigma + (sigma' - sigma) v* = x_sigma': the Euler step with the target velocity walks the forward
  process's straight line (float32 functions against the float64 line: atol 1e-6)."""
  x0, eps, _, _, _, _ = draw(7)
  f = lambda a: jnp.asarray(a, jnp.float32)
  for s, s2 in ((1.0, 0.7), (0.4, 0.1)):
    x = matching.noised(f(x0), f(eps), jnp.full((B,), s, jnp.float32))
    step = x + (s2 - s) * matching.velocity_target(f(x0), f(eps))
    np.testing.assert_allclose(np.asarray(step), (1 - s2) * x0 + s2 * eps, atol=1e-6)


def test_optimality_maps_advantages_to_probabilities():
  got = matching.optimality(jnp.array([-10.0, -5.0, 0.0, 2.5, 5.0, 7.0]), 5.0)
  np.testing.assert_allclose(np.asarray(got), [0.0, 0.0, 0.5, 0.75, 1.0, 1.0])


def ref_cps(x, v, sigma, sigma_next, a):
  std = sigma_next * math.sin(a * math.pi / 2)
  x0_hat, x1_hat = x - sigma * v, x + (1 - sigma) * v
  return x0_hat * (1 - sigma_next) + x1_hat * math.sqrt(sigma_next ** 2 - std ** 2), std


@pytest.mark.parametrize("sigma,sigma_next", [(1.0, 0.9), (0.6, 0.45), (0.2, 0.05)])
def test_cps_step_matches_float64_reference(sigma, sigma_next):
  x0, _, v, _, _, _ = draw(8)
  mu, std = flow.cps_step_mean(jnp.asarray(x0, jnp.float32), jnp.asarray(v, jnp.float32), sigma, sigma_next, 0.8)
  want_mu, want_std = ref_cps(x0, v, sigma, sigma_next, 0.8)
  np.testing.assert_allclose(np.asarray(mu), want_mu, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(std), want_std, rtol=1e-6)


def test_cps_keeps_the_marginal_mix():
  """With the true velocity of a point pair (x0, x1), the CPS step's mean plus its noise variance rebuild the
  forward process at sigma': (1 - sigma') x0 + sigma' * (unit-variance noise), in expectation and variance."""
  rng = np.random.default_rng(9)
  x0, x1 = rng.standard_normal((1, 64, 1, 1)), rng.standard_normal((1, 64, 1, 1))
  sigma, sigma_next, a = 0.7, 0.4, 0.8
  x = (1 - sigma) * x0 + sigma * x1
  mu, std = ref_cps(x, x1 - x0, sigma, sigma_next, a)
  # mu = (1 - s') x0 + sqrt(s'^2 - std^2) x1: the noise coefficients add in quadrature to s'.
  np.testing.assert_allclose(mu, (1 - sigma_next) * x0 + math.sqrt(sigma_next ** 2 - std ** 2) * x1, atol=1e-12)
  got, got_std = flow.cps_step_mean(jnp.asarray(x, jnp.float32), jnp.asarray(x1 - x0, jnp.float32), sigma,
                                    sigma_next, a)
  np.testing.assert_allclose(np.asarray(got), mu, atol=1e-5)
  np.testing.assert_allclose(float(got_std) ** 2 + (sigma_next ** 2 - std ** 2), sigma_next ** 2, rtol=1e-6)


def test_cps_on_policy_ratio_is_exactly_one():
  x0, eps, v, _, _, _ = draw(10)
  f = lambda a: jnp.asarray(a, jnp.float32)
  x_next, logp = flow.sde_step(f(x0), f(v), 0.6, 0.45, 0.8, f(eps), sde_type="cps")
  recomputed = flow.sde_logprob(x_next, *flow.cps_step_mean(f(x0), f(v), 0.6, 0.45, 0.8))
  np.testing.assert_array_equal(np.asarray(jnp.exp(recomputed - logp)), np.ones(B, np.float32))


def ref_cps_logprob(x_next, mu):
  """Flow-GRPO's CPS log-prob, float64 (yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py
  lines 85-89 at 54809b5: -((prev_sample - prev_sample_mean) ** 2), then the mean over all but the batch dim)."""
  return -np.mean((x_next - mu) ** 2, axis=tuple(range(1, x_next.ndim)))


@pytest.mark.parametrize("sigma,sigma_next", [(1.0, 0.9), (0.6, 0.45), (0.2, 0.05)])
def test_cps_reference_logprob_value_and_gradient_match_float64(sigma, sigma_next):
  """The value, and its gradient in the velocity through the step mean (central differences in float64)."""
  x, eps, v, _, _, _ = draw(11)
  f = lambda a: jnp.asarray(a, jnp.float32)
  mu64, std = ref_cps(x, v, sigma, sigma_next, 0.8)
  x_next = mu64 + std * eps
  got = flow.step_logprob("flow_grpo", f(x_next), *flow.cps_step_mean(f(x), f(v), sigma, sigma_next, 0.8))
  np.testing.assert_allclose(np.asarray(got), ref_cps_logprob(x_next, mu64), rtol=1e-5, atol=1e-6)
  # Against the density: the same log-ratio times 2 step_std^2 (the reference drops 1 / (2 std^2) and constants).
  moved = ref_cps(x, v * 1.01, sigma, sigma_next, 0.8)[0]
  density = lambda m: flow.sde_logprob(f(x_next), f(m), std)
  reference = lambda m: flow.step_logprob("flow_grpo", f(x_next), f(m), std)
  np.testing.assert_allclose(np.asarray(reference(moved) - reference(mu64)),
                             2 * std ** 2 * np.asarray(density(moved) - density(mu64)), rtol=2e-3)
  grad = jax.grad(lambda vv: jnp.sum(flow.step_logprob(
      "flow_grpo", f(x_next), *flow.cps_step_mean(f(x), vv, sigma, sigma_next, 0.8))))(f(v))
  h, k = 1e-6, (1, 0, 2, 3)
  bump = np.zeros_like(v)
  bump[k] = h
  fd = (ref_cps_logprob(x_next, ref_cps(x, v + bump, sigma, sigma_next, 0.8)[0]).sum()
        - ref_cps_logprob(x_next, ref_cps(x, v - bump, sigma, sigma_next, 0.8)[0]).sum()) / (2 * h)
  np.testing.assert_allclose(float(grad[k]), fd, rtol=1e-4, atol=1e-7)


def test_cps_reference_logprob_on_policy_ratio_is_exactly_one_and_no_noise_is_nan():
  x0, eps, v, _, _, _ = draw(12)
  f = lambda a: jnp.asarray(a, jnp.float32)
  x_next, logp = flow.sde_step(f(x0), f(v), 0.6, 0.45, 0.8, f(eps), sde_type="cps", logprob="flow_grpo")
  recomputed = flow.step_logprob("flow_grpo", x_next, *flow.cps_step_mean(f(x0), f(v), 0.6, 0.45, 0.8))
  np.testing.assert_array_equal(np.asarray(jnp.exp(recomputed - logp)), np.ones(B, np.float32))
  assert np.all(np.isnan(np.asarray(flow.step_logprob("flow_grpo", x_next, x_next, 0.0))))
  with pytest.raises(ValueError, match="logprob='exact' is not one of"):
    flow.step_logprob("exact", x_next, x_next, 0.5)


def ref_awm_ghuber(v, target, sigma, p):
  """AWM's ghuber log-likelihood, float64 (scxue/advantage_weighted_matching scripts/train_sd3_awm.py lines 248-249
  at be51372): -((mse + 1e-10)^p - 1e-10^p) * t / p, mse the per-sample mean squared error."""
  mse = np.mean((v - target) ** 2, axis=tuple(range(1, v.ndim)))
  return -(np.power(mse + 1e-10, p) - np.power(1e-10, p)) * sigma / p


@pytest.mark.parametrize("p", [0.25, 1.0])
def test_awm_ghuber_value_and_gradient_match_float64(p):
  x0, eps, v, _, sigma, _ = draw(13)
  target = eps - x0
  got = matching.awm_logprob(jnp.asarray(v, jnp.float32), jnp.asarray(target, jnp.float32), sigma, "ghuber", p)
  np.testing.assert_allclose(np.asarray(got), ref_awm_ghuber(v, target, sigma, p), rtol=1e-5)
  if p == 1.0:  # p = 1 is the "t" weighting up to the floor
    t = matching.awm_logprob(jnp.asarray(v, jnp.float32), jnp.asarray(target, jnp.float32), sigma, "t")
    np.testing.assert_allclose(np.asarray(got), np.asarray(t), rtol=1e-5)
  grad = jax.grad(lambda vv: jnp.sum(matching.awm_logprob(vv, jnp.asarray(target, jnp.float32), sigma, "ghuber",
                                                          p)))(jnp.asarray(v, jnp.float32))
  h, k = 1e-6, (2, 1, 3, 0)
  bump = np.zeros_like(v)
  bump[k] = h
  fd = (ref_awm_ghuber(v + bump, target, sigma, p).sum() - ref_awm_ghuber(v - bump, target, sigma, p).sum()) / (2 * h)
  np.testing.assert_allclose(float(grad[k]), fd, rtol=1e-4)


def test_awm_advantage_rescale_matches_the_reference():
  """AWM's advantages (scripts/train_sd3_awm.py lines 1292-1299): clamp to +-adv_clip_max, then / adv_clip_max *
  advantage_max; its released 5 and 1 put them in [-1, 1]."""
  adv = np.array([-9.0, -5.0, -1.3, 0.0, 2.5, 7.0])
  want = np.clip(adv, -5.0, 5.0) / 5.0 * 1.0
  np.testing.assert_allclose(np.asarray(matching.rescaled_advantages(adv, 5.0, 1.0)), want, rtol=1e-7)


def test_dgpo_weighted_loss_has_the_gradient_of_the_group_dpo_loss():
  """sum_i w_g A_i err_i with w_g = sigmoid(S_g) held fixed, times beta / G, has the gradient of the group's
  -log sigmoid(-S_g), S_g = beta / G sum_i A_i (err_i - ref_i): DGPO's "gradient-equivalent" form (its
  scripts/train_sd3_dgpo.py lines 185-193). Float64 central differences in each sample's velocity."""
  rng = np.random.default_rng(14)
  g, beta = 4, 20.0
  v, target = rng.standard_normal((2 * g, 3, 2, 2)) * 0.3, rng.standard_normal((2 * g, 3, 2, 2)) * 0.3
  ref = rng.uniform(0.05, 0.2, 2 * g)
  adv = rng.standard_normal(2 * g)
  err = lambda vv: np.mean((vv - target) ** 2, axis=(1, 2, 3))
  s_groups = lambda vv: (adv * beta * (err(vv) - ref) / g).reshape(2, g).sum(1)
  dpo = lambda vv: float(np.sum(np.log1p(np.exp(s_groups(vv)))))  # -log sigmoid(-S) = log(1 + e^S)
  weights = matching.dgpo_group_weights(jnp.asarray((err(v) - ref)[:, None], jnp.float32), adv, g, beta)
  np.testing.assert_allclose(np.asarray(weights)[:, 0], np.repeat(1 / (1 + np.exp(-s_groups(v))), g), rtol=1e-5)
  ours = jax.grad(lambda vv: jnp.sum(weights[:, 0] * adv * matching.flow_error(vv, jnp.asarray(target))))(
      jnp.asarray(v, jnp.float32))
  for idx in [(0, 1, 0, 1), (5, 2, 1, 0)]:
    bump = np.zeros_like(v)
    bump[idx] = 1e-6
    fd = (dpo(v + bump) - dpo(v - bump)) / 2e-6
    np.testing.assert_allclose(float(ours[idx]) * beta / g, fd, rtol=1e-4)
