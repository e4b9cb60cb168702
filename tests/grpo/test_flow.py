"""Flow-GRPO's SDE step (glmrl.grpo.flow) against an independent float64 numpy oracle of the formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.grpo.flow import (flow_policy_loss, guard_log_ratio, mean_kl, sde_logprob, sde_std, sde_step,
                             sde_step_mean)
from glmrl.sampling.scheduler import euler_step, euler_step_at, glm_image_schedule

# A 1024x1024 GLM-Image schedule with 10 steps: starts at sigma = 1 exactly, ends at 0.
SIGMAS = glm_image_schedule(10, 1024, 1024).sigmas
# (sigma, sigma_next) pairs: the guarded first step, the middle, the last step (to sigma = 0).
PAIRS = [(SIGMAS[0], SIGMAS[1]), (SIGMAS[4], SIGMAS[5]), (np.float32(0.3), np.float32(0.25)),
         (SIGMAS[-2], SIGMAS[-1])]
A = 0.7  # Flow-GRPO's default noise level


def ref_std(sigma, sigma_next, a, guard=None):
  """float64: std_t = a sqrt(sigma / (1 - sigma')), sigma' = guard where sigma == 1; step std = std_t sqrt(-dt)."""
  s, sn = np.asarray(sigma, np.float64), np.asarray(sigma_next, np.float64)
  g = sn if guard is None else np.asarray(guard, np.float64)
  std = a * np.sqrt(s / (1.0 - np.where(s == 1.0, g, s)))
  return std, std * np.sqrt(s - sn)


def expand(a, x):
  a = np.asarray(a, np.float64)
  return a if a.ndim == 0 else a.reshape((-1,) + (1,) * (x.ndim - 1))


def ref_mean(x, v, sigma, sigma_next, a, guard=None):
  """float64 Flow-GRPO mean, written as the reference code groups it: x (1 + c dt) + v (1 + c (1 - s)) dt."""
  x, v = np.asarray(x, np.float64), np.asarray(v, np.float64)
  std, step = ref_std(sigma, sigma_next, a, guard)
  s, sn, std = expand(sigma, x), expand(sigma_next, x), expand(std, x)
  dt = sn - s
  c = std ** 2 / (2 * s)
  return x * (1 + c * dt) + v * (1 + c * (1 - s)) * dt, step


def ref_logprob(x_next, mu, step):
  x_next, mu = np.asarray(x_next, np.float64), np.asarray(mu, np.float64)
  s = expand(step, mu)
  per = -(x_next - mu) ** 2 / (2 * s ** 2) - np.log(s) - np.log(np.sqrt(2 * np.pi))
  return per.reshape(per.shape[0], -1).mean(1)


def data(seed, shape=(3, 4, 5, 6), v_dtype=np.float32):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=shape).astype(np.float32)
  v = rng.normal(size=shape).astype(v_dtype)
  eps = rng.normal(size=shape).astype(np.float32)
  return x, v, eps


def bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


@pytest.mark.parametrize("sigma,sigma_next", PAIRS)
def test_matches_float64_reference(sigma, sigma_next):
  x, v, eps = data(0)
  std_t, step = sde_std(sigma, sigma_next, A)
  want_std, want_step = ref_std(sigma, sigma_next, A)
  np.testing.assert_allclose(std_t, want_std, rtol=1e-6)
  np.testing.assert_allclose(step, want_step, rtol=1e-6)
  mu, _ = sde_step_mean(x, v, sigma, sigma_next, A)
  want_mu, _ = ref_mean(x, v, sigma, sigma_next, A)
  assert mu.dtype == jnp.float32
  # float32 rounding of x + dt * drift: a few ulps of |x| + |dt drift| (values up to ~4; observed <= 1.5e-7).
  np.testing.assert_allclose(mu, want_mu, rtol=0, atol=1e-6)
  x_next, logp = sde_step(x, v, sigma, sigma_next, A, eps)
  np.testing.assert_allclose(x_next, want_mu + want_step * eps, rtol=0, atol=1e-6)
  # The log-prob of a given x_next: mu's float32 error (atol above) enters through (x' - mu) / step_std^2,
  # at most ~1e-6 * |eps| / step_std per element (step_std >= 0.1 here) and averaging down over the
  # 120 elements; the log-prob is of order 1 (observed error <= 3e-7): 1e-5 relative, 1e-6 absolute.
  np.testing.assert_allclose(logp, ref_logprob(x_next, want_mu, want_step), rtol=1e-5, atol=1e-6)
  # sde_logprob alone, given the same float32 mean: only its own rounding.
  np.testing.assert_allclose(sde_logprob(x_next, mu, step), ref_logprob(x_next, mu, want_step), rtol=2e-6, atol=2e-6)


def test_per_sample_sigmas_match_the_float64_reference_and_scalar_calls():
  x, v, eps = data(1, shape=(4, 3, 2, 2))
  sigma = np.array([SIGMAS[0], SIGMAS[3], 0.3, SIGMAS[-2]], np.float32)
  sigma_next = np.array([SIGMAS[1], SIGMAS[4], 0.25, SIGMAS[-1]], np.float32)
  noise = np.array([0.7, 0.5, 1.0, 0.3], np.float32)
  x_next, logp = sde_step(x, v, sigma, sigma_next, noise, eps)
  want_mu, want_step = ref_mean(x, v, sigma, sigma_next, noise)
  np.testing.assert_allclose(x_next, want_mu + expand(want_step, x) * eps, rtol=0, atol=2e-6)
  np.testing.assert_allclose(logp, ref_logprob(x_next, want_mu, want_step), rtol=1e-5, atol=1e-5)
  for b in range(4):
    xb, lb = sde_step(x[b:b + 1], v[b:b + 1], sigma[b], sigma_next[b], float(noise[b]), eps[b:b + 1])
    np.testing.assert_array_equal(x_next[b:b + 1], xb)
    np.testing.assert_allclose(logp[b], lb[0], rtol=1e-6)


def test_sigma_one_guard():
  """At sigma = 1, 1 - sigma is replaced by 1 - sigma_guard (default: sigma_next, Flow-GRPO's sigmas[1])."""
  assert SIGMAS[0] == 1.0  # GLM-Image schedules start at pure noise: the guard is used on every trajectory
  std_t, step = sde_std(1.0, SIGMAS[1], A)
  np.testing.assert_allclose(std_t, A * np.sqrt(1.0 / (1.0 - np.float64(SIGMAS[1]))), rtol=1e-6)
  np.testing.assert_allclose(step, std_t * np.sqrt(1.0 - np.float64(SIGMAS[1])), rtol=1e-6)
  guarded, _ = sde_std(1.0, SIGMAS[1], A, sigma_guard=0.9)
  np.testing.assert_allclose(guarded, A * np.sqrt(1.0 / 0.1), rtol=1e-6)
  # Below 1 the guard is not used.
  assert sde_std(0.95, 0.9, A, sigma_guard=0.5)[0] == sde_std(0.95, 0.9, A)[0]
  x, v, eps = data(2)
  x_next, logp = sde_step(x, v, 1.0, SIGMAS[1], A, eps)
  assert np.all(np.isfinite(x_next)) and np.all(np.isfinite(logp))
  # A one-step schedule [1, 0]: the guard is 0, std_t = a.
  np.testing.assert_allclose(sde_std(1.0, 0.0, A)[0], A, rtol=1e-7)


@pytest.mark.parametrize("v_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("x_in_v_dtype", [False, True])
def test_noise_free_step_is_euler_step_bitwise(v_dtype, x_in_v_dtype):
  x, v, eps = data(3)
  v = jnp.asarray(v, v_dtype)
  x = jnp.asarray(x, v_dtype if x_in_v_dtype else jnp.float32)
  for i in range(len(SIGMAS) - 1):
    want = euler_step(x, v, SIGMAS[i], SIGMAS[i + 1])
    x_next, logp = sde_step(x, v, SIGMAS[i], SIGMAS[i + 1], 0.0, eps)
    assert x_next.dtype == want.dtype == v_dtype
    np.testing.assert_array_equal(bits(x_next), bits(want))
    mu, step = sde_step_mean(x, v, SIGMAS[i], SIGMAS[i + 1], 0.0)
    np.testing.assert_array_equal(bits(mu.astype(v_dtype)), bits(want))
    assert step == 0.0
    # Deterministic: no density, NaN rather than a stand-in value.
    assert logp.shape == (x.shape[0],) and np.all(np.isnan(logp))
  # Under jit, with the schedule read at a traced index (euler_step_at), and a traced zero noise level.
  step_at = jax.jit(lambda i: euler_step_at(SIGMAS, i, x, v))
  sde_at = jax.jit(lambda i, a: sde_step_mean(x, v, jnp.asarray(SIGMAS)[i], jnp.asarray(SIGMAS)[i + 1], a)[0]
                   .astype(v_dtype))
  for i in (0, 4, 9):
    np.testing.assert_array_equal(bits(sde_at(i, 0.0)), bits(step_at(i)))


@pytest.mark.parametrize("v_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("jit", [False, True])
def test_on_policy_ratio_is_exactly_one(v_dtype, jit):
  """The learner recomputes logp from the stored (x, x_next) and the same v: the ratio is exactly 1."""
  x, v, eps = data(4)
  v = jnp.asarray(v, v_dtype)
  sigma = np.array([SIGMAS[0], SIGMAS[2], SIGMAS[5]], np.float32)
  sigma_next = np.array([SIGMAS[1], SIGMAS[3], SIGMAS[6]], np.float32)
  step_fn = lambda x, v, eps: sde_step(x, v, sigma, sigma_next, A, eps)
  recompute = lambda x, v, x_next: sde_logprob(x_next, *sde_step_mean(x, v, sigma, sigma_next, A))
  if jit:
    step_fn, recompute = jax.jit(step_fn), jax.jit(recompute)
  x_next, old = step_fn(x, v, eps)
  assert x_next.dtype == v_dtype
  new = recompute(x, v, x_next)
  ratio = np.asarray(jnp.exp(new - old))
  assert np.all(np.isfinite(old)) and np.all(ratio == 1.0), ratio
  # A different velocity moves the ratio away from 1 (the check above can fail).
  moved = recompute(x, (v.astype(jnp.float32) * 1.01).astype(v_dtype), x_next)
  assert np.all(np.asarray(jnp.exp(moved - old)) != 1.0)


@pytest.mark.parametrize("sigma,sigma_next", PAIRS[:3])
def test_logprob_gradient_wrt_velocity(sigma, sigma_next):
  x, v, eps = data(5, shape=(2, 2, 3))
  mu0, step = sde_step_mean(x, v, sigma, sigma_next, A)
  # A sample not at the mean of the new velocity (otherwise the gradient vanishes).
  x_next = np.asarray(mu0) + np.float32(step) * eps
  w = np.array([0.7, -1.3], np.float32)  # weights per sample, like advantages

  def f(v):
    return jnp.sum(w * sde_logprob(x_next, sde_step_mean(x, v, sigma, sigma_next, A)[0], step))

  grad = np.asarray(jax.grad(f)(jnp.asarray(v)), np.float64)
  # Analytic: d logp_b / d v = (x' - mu) / (D s^2) * dmu/dv, dmu/dv = dt (1 + std_t^2 (1 - sigma) / (2 sigma)).
  want_mu, want_step = ref_mean(x, v, sigma, sigma_next, A)
  std_t = ref_std(sigma, sigma_next, A)[0]
  s, sn = np.float64(sigma), np.float64(sigma_next)
  dmu_dv = (sn - s) * (1 + std_t ** 2 * (1 - s) / (2 * s))
  D = x[0].size
  analytic = w[:, None, None] * (x_next - want_mu) / (D * want_step ** 2) * dmu_dv
  np.testing.assert_allclose(grad, analytic, rtol=1e-4, atol=1e-7)
  # Central finite differences of the float64 oracle, element by element.
  fd = np.zeros_like(grad)
  h = 1e-6
  for idx in np.ndindex(v.shape):
    vp, vm = v.astype(np.float64), v.astype(np.float64)
    vp[idx] += h
    vm[idx] -= h
    fp = np.sum(w * ref_logprob(x_next, ref_mean(x, vp, sigma, sigma_next, A)[0], want_step))
    fm = np.sum(w * ref_logprob(x_next, ref_mean(x, vm, sigma, sigma_next, A)[0], want_step))
    fd[idx] = (fp - fm) / (2 * h)
  np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-7)
  assert np.max(np.abs(grad)) > 1e-3  # not trivially zero


@pytest.mark.parametrize("sigma,sigma_next", [PAIRS[0], PAIRS[3]])
def test_samples_have_the_policy_mean_and_std(sigma, sigma_next):
  n = 40000
  x1, v1, _ = data(6, shape=(1, 2, 2))
  x, v = np.repeat(x1, n, 0), np.repeat(v1, n, 0)
  eps = jax.random.normal(jax.random.key(0), x.shape, jnp.float32)
  x_next, logp = sde_step(x, v, sigma, sigma_next, A, eps)
  mu, step = sde_step_mean(x1, v1, sigma, sigma_next, A)
  s = float(step)
  x_next = np.asarray(x_next, np.float64)
  # Standard errors: mean s / sqrt(n), std s / sqrt(2n); 5 of them.
  np.testing.assert_allclose(x_next.mean(0), mu[0], rtol=0, atol=5 * s / math.sqrt(n))
  np.testing.assert_allclose(x_next.std(0, ddof=1), s, rtol=5 / math.sqrt(2 * n))
  # E[logp] = -1/2 - log s - log sqrt(2 pi) (minus the per-element entropy); a sample's logp is
  # -(mean of D = 4 chi^2_1 / 2) + const, whose std is sqrt(0.5 / 4).
  want = -0.5 - math.log(s) - 0.5 * math.log(2 * math.pi)
  np.testing.assert_allclose(np.mean(logp), want, rtol=0, atol=5 * math.sqrt(0.5 / 4) / math.sqrt(n))


def test_mean_kl_golden_values():
  mu = np.array([[1.0, -1.0, 2.0, 0.0], [0.5, 0.5, 0.5, 0.5]], np.float32)
  mu_ref = np.zeros_like(mu)
  # Sample 0: mean of squares 6/4 = 1.5, s = 0.5: 1.5 / (2 * 0.25) = 3. Sample 1: 0.25 / (2 * 4) = 1/32.
  np.testing.assert_allclose(mean_kl(mu, mu_ref, np.array([0.5, 2.0], np.float32)), [3.0, 1 / 32], rtol=1e-7)
  np.testing.assert_allclose(mean_kl(mu, mu_ref, 0.5), [3.0, 0.5], rtol=1e-7)
  rng = np.random.default_rng(7)
  mu, mu_ref = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
  step = np.array([0.3, 0.05, 1.7], np.float32)
  want = ((mu.astype(np.float64) - mu_ref) ** 2).reshape(3, -1).mean(1) / (2 * step.astype(np.float64) ** 2)
  got = mean_kl(mu, mu_ref, step)
  assert got.shape == (3,) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_array_equal(mean_kl(mu, mu, step), np.zeros(3))


def test_mean_kl_is_the_gaussian_kl_of_the_step():
  """KL(N(mu, s^2) || N(mu_ref, s^2)) per element = the log-ratio at the policy's own mean (and its expectation)."""
  x, v, eps = data(8)
  v_ref = v + 0.1 * data(9)[1]
  sigma, sigma_next = PAIRS[1]
  mu, step = sde_step_mean(x, v, sigma, sigma_next, A)
  mu_ref, _ = sde_step_mean(x, v_ref, sigma, sigma_next, A)
  kl = mean_kl(mu, mu_ref, step)
  assert np.all(np.asarray(kl) > 0)
  np.testing.assert_allclose(kl, sde_logprob(mu, mu, step) - sde_logprob(mu, mu_ref, step), rtol=1e-4)
  # Flow-GRPO's training code divides by 2 std_t^2 (no sqrt(-dt)): that value is this KL times -dt.
  std_t, _ = sde_std(sigma, sigma_next, A)
  np.testing.assert_allclose(mean_kl(mu, mu_ref, std_t), kl * (np.float64(sigma) - np.float64(sigma_next)), rtol=1e-5)


def test_jit_matches_eager_with_traced_schedule():
  x, v, eps = data(10)
  sigma, sigma_next = PAIRS[0]
  eager = sde_step(x, v, sigma, sigma_next, A, eps)
  jitted = jax.jit(sde_step)(x, v, sigma, sigma_next, A, eps)
  for a, b in zip(eager, jitted):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  # The schedule read at a traced step index, as a sampling loop does.
  at = jax.jit(lambda i: sde_step(x, v, jnp.asarray(SIGMAS)[i], jnp.asarray(SIGMAS)[i + 1], A, eps))(0)
  for a, b in zip(eager, at):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("call,match", [
    (lambda x: sde_std(0.5, 0.5, A), "sigma_next"),
    (lambda x: sde_std(0.5, 0.6, A), "sigma_next"),
    (lambda x: sde_std(1.2, 0.6, A), "sigma="),
    (lambda x: sde_std(0.0, 0.0, A), "sigma="),
    (lambda x: sde_std(0.5, 0.4, -0.1), "noise_level"),
    (lambda x: sde_std(1.0, 0.9, A, sigma_guard=1.0), "sigma_guard"),
    (lambda x: sde_step_mean(x, x[:, :2], 0.5, 0.4, A), "shape"),
    (lambda x: sde_step_mean(x, x, np.array([0.5, 0.6], np.float32), 0.4, A), "one per sample"),
    (lambda x: sde_step(x, x, 0.5, 0.4, A, x[:1]), "eps"),
    (lambda x: mean_kl(x, x[:1], 0.1), "mu_ref"),
])
def test_rejects_invalid_inputs(call, match):
  x = np.zeros((3, 4), np.float32)
  with pytest.raises(ValueError, match=match):
    call(x)


def ref_flow_loss(logp, old, adv, mask, clip, adv_max, kl=None, beta=0.0):
  """float64 Flow-GRPO per-timestep loss terms (train_sd3.py): (sum of masked terms, count)."""
  logp, old, mask = (np.asarray(a, np.float64) for a in (logp, old, mask))
  a = np.clip(np.asarray(adv, np.float64), -adv_max, adv_max)
  r = np.exp(logp - old)
  term = np.maximum(-a * r, -a * np.clip(r, 1 - clip, 1 + clip))
  if kl is not None:
    term = term + beta * np.asarray(kl, np.float64)
  return float(np.sum(term * mask)), float(np.sum(mask))


@pytest.mark.parametrize("with_kl", [False, True])
def test_flow_policy_loss_matches_float64_reference(with_kl):
  rng = np.random.default_rng(7)
  b = 6
  logp = rng.normal(size=b).astype(np.float32) * 0.01
  old = logp + rng.normal(size=b).astype(np.float32) * 2e-4  # some ratios outside 1 +- 1e-4
  adv = np.array([-7.0, -1.0, -0.2, 0.3, 2.0, 9.0], np.float32)  # two beyond adv_clip_max = 5
  mask = np.array([1, 1, 0, 1, 1, 1], np.float32)
  kl = np.abs(rng.normal(size=b)).astype(np.float32) if with_kl else None
  num, den, aux = flow_policy_loss(logp, old, adv, mask, clip_range=1e-4, adv_clip_max=5.0, kl_B=kl, beta=0.3)
  want_num, want_den = ref_flow_loss(logp, old, adv, mask, 1e-4, 5.0, kl, 0.3)
  np.testing.assert_allclose(float(num), want_num, rtol=1e-5, atol=1e-7)
  assert float(den) == want_den == 5.0
  r = np.exp(logp.astype(np.float64) - old)[mask > 0]
  np.testing.assert_allclose([float(aux["ratio_min"]), float(aux["ratio_max"])], [r.min(), r.max()], rtol=1e-6)
  if with_kl:
    np.testing.assert_allclose(float(aux["kl_mean"]), np.sum(kl * mask) / 5.0, rtol=1e-6)
  # On-policy (old = logp): every ratio is exactly 1 and the loss is -mean(clipped advantages).
  num, den, aux = flow_policy_loss(logp, logp, adv, mask, clip_range=1e-4, adv_clip_max=5.0)
  assert float(aux["ratio_min"]) == float(aux["ratio_max"]) == 1.0
  np.testing.assert_allclose(float(num) / float(den), -np.sum(np.clip(adv, -5, 5) * mask) / 5.0, rtol=1e-6)


@pytest.mark.parametrize("sigma,sigma_next", PAIRS[1:])
def test_guard_log_ratio_matches_the_reference_formula_and_is_unbiased(sigma, sigma_next):
  """GRPO-Guard's ratio as Flow-Factory's GRPOGuardTrainer writes it, in float64: exp((logp - old) s + mse / (2 s)),
  s the step std; and its closed form mean((mu - mu_old) eps) for a step the old policy sampled."""
  x, v, eps = data(11)
  v_new = v + 0.05 * np.random.default_rng(12).normal(size=v.shape).astype(np.float32)
  mu_old, step = ref_mean(x, v, sigma, sigma_next, A)
  mu_new, _ = ref_mean(x, v_new, sigma, sigma_next, A)
  x_next = mu_old + expand(step, mu_old) * eps
  logp_old, logp_new = ref_logprob(x_next, mu_old, step), ref_logprob(x_next, mu_new, step)
  mse = ((mu_new - mu_old) ** 2).reshape(3, -1).mean(1)
  want = (logp_new - logp_old) * step + mse / (2 * step)
  got = guard_log_ratio(jnp.asarray(logp_new, jnp.float32), jnp.asarray(logp_old, jnp.float32),
                        jnp.asarray(mu_new, jnp.float32), jnp.asarray(mu_old, jnp.float32), np.float32(step))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(want, ((mu_new - mu_old) * eps).reshape(3, -1).mean(1), rtol=1e-9, atol=1e-12)
  # The plain log-ratio is shifted by -mse / (2 s^2) at every step; the guard's is not.
  np.testing.assert_allclose((logp_new - logp_old) - want / step, -mse / (2 * step ** 2), rtol=1e-9)
  # On-policy (old = the new itself) it is 0 exactly: the ratio exp(0) = 1.
  same = guard_log_ratio(jnp.asarray(logp_new, jnp.float32), jnp.asarray(logp_new, jnp.float32),
                         jnp.asarray(mu_new, jnp.float32), jnp.asarray(mu_new, jnp.float32), np.float32(step))
  assert np.all(np.asarray(same) == 0.0)
