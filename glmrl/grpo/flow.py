"""Flow-GRPO's SDE sampling step for flow-matching models: the Gaussian policy of one denoising step.

GRPO needs a stochastic policy with a tractable likelihood; the Euler ODE step of flow matching
(`glmrl.sampling.scheduler.euler_step`) is deterministic. Flow-GRPO's ODE-to-SDE conversion (Liu
et al. 2025, "Flow-GRPO: Training Flow Matching Models via Online RL", arXiv:2505.05470) replaces
it by the Euler-Maruyama step of an SDE with the same marginals, so that each step x_t -> x_{t+1}
is a Gaussian with a closed-form log-density:

  std_t = a sqrt(sigma / (1 - sigma))                                   (a = noise_level)
  mu    = x + dt (v + std_t^2 / (2 sigma) (x + (1 - sigma) v)),         dt = sigma' - sigma < 0
  x'    = mu + std_t sqrt(-dt) eps,                                     eps ~ N(0, I)

with v the (CFG-guided) velocity and sigma, sigma' = sigma_t, sigma_{t+1}. The reference code is
flow_grpo/diffusers_patch/sd3_sde_with_logprob.py (`sde_step_with_logprob`, lines 44-68) and
scripts/train_sd3.py (ratio and KL, lines 884-896) of github.com/yifan123/flow_grpo; this module
reimplements its formulas, in float32 like the reference (which upcasts because bf16 overflows
in the mean), with three documented departures: the mean is grouped as x + dt * drift (the
reference expands it) so that noise_level 0 is the Euler step bit for bit, `sde_step` returns the
next latent in the velocity's dtype and scores that rounded value, and `mean_kl` is the exact
Gaussian KL (the reference's KL term differs by a factor -dt).

Shapes: x, v, eps, mu are [B, ...] (any latent layout, e.g. [B, C, h, w]); sigma, sigma_next,
noise_level and sigma_guard are scalars or per-sample [B] vectors, broadcast over the latent dims.
All functions are pure, jit-able and free of Python control flow on traced values; the only
Python branch is on a static noise_level == 0 (the exact ODE step). A trajectory's per-step
log-probs stack to [B, steps], the [batch, tokens] layout `policy_loss` takes.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from glmrl.grpo._checks import is_static, latent_axes, per_sample, same_shape
from glmrl.grpo.loss import policy_loss

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _concrete(a):
  """float64 numpy value of a non-traced input (for host-side checks), None for a tracer."""
  if a is None or isinstance(a, jax.core.Tracer):
    return None
  return np.asarray(a, np.float64)


def _check_schedule(sigma, sigma_next, noise_level, sigma_guard):
  s, s_next = _concrete(sigma), _concrete(sigma_next)
  a, guard = _concrete(noise_level), _concrete(sigma_guard)
  for name, val in (("sigma", s), ("sigma_next", s_next), ("noise_level", a), ("sigma_guard", guard)):
    if val is not None and val.ndim > 1:
      raise ValueError(f"{name} must be a scalar or a per-sample [B] vector, got shape {val.shape}")
  if s is not None and not np.all((s > 0) & (s <= 1)):
    raise ValueError(f"sigma={s} must lie in (0, 1] (the flow's time; 1 is pure noise)")
  if s_next is not None and not np.all(s_next >= 0):
    raise ValueError(f"sigma_next={s_next} must be >= 0")
  if s is not None and s_next is not None and not np.all(s_next < s):
    raise ValueError(f"sigma_next={s_next} must be < sigma={s}: a denoising step has dt = sigma_next - sigma < 0")
  if a is not None and not np.all(a >= 0):
    raise ValueError(f"noise_level={a} must be >= 0")
  if guard is not None and not np.all((guard >= 0) & (guard < 1)):
    raise ValueError(f"sigma_guard={guard} must lie in [0, 1) (it replaces sigma = 1 in 1 - sigma)")


def sde_std(sigma, sigma_next, noise_level, sigma_guard=None):
  """(std_t, step_std): the SDE's diffusion coefficient at sigma and the step's noise std.

  std_t = noise_level * sqrt(sigma / (1 - sigma')), with sigma' = where(sigma == 1, sigma_guard,
  sigma) in the denominator only, and step_std = std_t * sqrt(sigma - sigma_next), the std of
  x' given x (Euler-Maruyama: the noise of a step of length -dt is std_t sqrt(-dt)).

  The guard: std_t diverges at sigma = 1 (the first step of a schedule that starts at pure noise,
  which GLM-Image's does: its first sigma is shift(1) == 1 exactly). Flow-GRPO
  (sd3_sde_with_logprob.py lines 44 and 47) replaces sigma by the schedule's second sigma,
  `sigmas[1]`, in the factor 1 - sigma and keeps the numerator sigma = 1; so does this function,
  in the same float32 order of operations. sigma_guard=None takes sigma_next: on a strictly decreasing
  schedule sigma == 1 only at step 0, whose sigma_next is `sigmas[1]`, so the default is exactly
  Flow-GRPO's value without the caller passing the schedule. Pass sigma_guard explicitly to use
  another one (e.g. the same value for every step of a re-sampled schedule). Where sigma < 1 the
  guard is not used. The mean's std_t^2 / (2 sigma) keeps the true sigma (as the reference does).

  Args:
    sigma: sigma_t, scalar or [B], in (0, 1].
    sigma_next: sigma_{t+1} < sigma, scalar or [B].
    noise_level: a >= 0, scalar or [B] (Flow-GRPO's default is 0.7).
    sigma_guard: replaces sigma = 1 in 1 - sigma; None: sigma_next.

  Returns:
    (std_t, step_std), float32 of the broadcast shape of the arguments (scalar or [B]).
  """
  _check_schedule(sigma, sigma_next, noise_level, sigma_guard)
  f32 = jnp.float32
  sigma, sigma_next = jnp.asarray(sigma, f32), jnp.asarray(sigma_next, f32)
  guard = sigma_next if sigma_guard is None else jnp.asarray(sigma_guard, f32)
  dt = sigma_next - sigma
  std_t = jnp.sqrt(sigma / (1.0 - jnp.where(sigma == 1.0, guard, sigma))) * jnp.asarray(noise_level, f32)
  return std_t, std_t * jnp.sqrt(-dt)


def sde_step_mean(x, v, sigma, sigma_next, noise_level, sigma_guard=None):
  """(mu, step_std): the Gaussian policy N(mu, step_std^2 I) of one SDE step from x with velocity v.

  mu = x + dt (v + std_t^2 / (2 sigma) (x + (1 - sigma) v)), dt = sigma_next - sigma: the Euler
  step of the drift v - std_t^2/2 * score (the flow's score is -(x + (1 - sigma) v) / sigma), the
  reference's `prev_sample_mean` regrouped so that std_t = 0 leaves exactly x + dt * v. With a
  static noise_level == 0 (a Python or numpy 0) the mean is computed as `euler_step` computes its
  result, x + dt * v in float32, so mu.astype(v.dtype) equals euler_step bitwise. A traced zero
  takes the general formula; for finite inputs the term 0 * (...) it adds to v cannot change
  x + dt * v (tested bitwise), but with an inf or NaN latent it turns into NaN where Euler keeps inf.

  Args:
    x: latents [B, ...], any float dtype (cast to float32: bf16 overflows in the mean).
    v: the (CFG-guided) velocity, x's shape.
    sigma, sigma_next, noise_level, sigma_guard: as in `sde_std`.

  Returns:
    mu [B, ...] float32, and step_std (float32, scalar or [B]) for `sde_logprob` / `mean_kl`.
  """
  x, v = jnp.asarray(x), jnp.asarray(v)
  same_shape("v", v, "x", x)
  latent_axes(x)
  std_t, step_std = sde_std(sigma, sigma_next, noise_level, sigma_guard)
  f32 = jnp.float32
  x32, v32 = x.astype(f32), v.astype(f32)
  sigma_b = per_sample("sigma", sigma, x)
  dt_b = per_sample("sigma_next", sigma_next, x) - sigma_b
  if is_static(noise_level) and noise_level == 0:
    return x32 + dt_b * v32, step_std
  std_b = per_sample("std_t", std_t, x)
  drift = v32 + jnp.square(std_b) / (2.0 * sigma_b) * (x32 + (1.0 - sigma_b) * v32)
  return x32 + dt_b * drift, step_std


SDE_TYPES = ("sde", "cps")


def cps_step_mean(x, v, sigma, sigma_next, noise_level):
  """(mu, step_std) of one step of Flow-CPS, the coefficient-preserving sampler of Flow-GRPO's newer recipe
  (`sde_type='cps'`, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py):

    step_std = sigma' sin(a pi / 2),   x0^ = x - sigma v,   x1^ = x + (1 - sigma) v,
    mu       = (1 - sigma') x0^ + sqrt(sigma'^2 - step_std^2) x1^

  The next latent mu + step_std eps then holds exactly the (1 - sigma') : sigma' mix of data and noise the
  flow's marginal has at sigma' (the predicted noise and the fresh one add in quadrature), where the SDE of
  `sde_step_mean` only approximates it. Its noise vanishes at sigma' = 0: a window must not hold the final step.

  Its log-prob: by default `sde_logprob`, the density, so the PPO ratio is the likelihood ratio of the step on
  the same per-element scale as the SDE's; `cps_reference_logprob` is the reference's (-mean((x' - mu)^2), the
  log-density times 2 step_std^2 up to a constant), `logprob="flow_grpo"`.
  """
  x, v = jnp.asarray(x), jnp.asarray(v)
  same_shape("v", v, "x", x)
  latent_axes(x)
  f32 = jnp.float32
  x32, v32 = x.astype(f32), v.astype(f32)
  a = jnp.asarray(noise_level, f32)
  sigma_next32 = jnp.asarray(sigma_next, f32)
  step_std = sigma_next32 * jnp.sin(a * (jnp.pi / 2))
  sigma_b = per_sample("sigma", sigma, x)
  next_b = per_sample("sigma_next", sigma_next32, x)
  std_b = per_sample("step_std", step_std, x)
  mu = (x32 - sigma_b * v32) * (1.0 - next_b) + (x32 + (1.0 - sigma_b) * v32) * jnp.sqrt(
      jnp.square(next_b) - jnp.square(std_b))
  return mu, step_std


def step_mean(sde_type: str, x, v, sigma, sigma_next, noise_level, sigma_guard=None):
  """(mu, step_std) of one stochastic step of `sde_type` ("sde": `sde_step_mean`, "cps": `cps_step_mean`, which
  has no sigma = 1 singularity to guard)."""
  if sde_type == "cps":
    return cps_step_mean(x, v, sigma, sigma_next, noise_level)
  if sde_type != "sde":
    raise ValueError(f"sde_type={sde_type!r} is not one of {list(SDE_TYPES)}")
  return sde_step_mean(x, v, sigma, sigma_next, noise_level, sigma_guard)


def sde_logprob(x_next, mu, step_std):
  """[B] log N(x_next; mu, step_std^2 I) averaged, not summed, over the latent (non-batch) dims.

  Per element: -(x' - mu)^2 / (2 step_std^2) - log(step_std) - log(sqrt(2 pi)), then the mean over
  all non-batch axes, as Flow-GRPO (sd3_sde_with_logprob.py lines 61-68). Why the mean: the sum,
  the true log-density of the whole latent, grows with the resolution D (tens of thousands of
  elements), and so does every log-ratio logp_new - logp_old: an update that moves each element's
  likelihood by a tiny amount moves the sum by D times that, so exp(sum) saturates the PPO clip at
  once and its range would depend on the image size. The mean is the per-element average
  log-density, on a scale independent of D. What it does to the clip: exp(mean(logp_new -
  logp_old)) is the geometric mean of the D per-element ratios, so Flow-GRPO's clip range of 1e-4
  (config/base.py line 86, `train.clip_range`) bounds the average per-element log-ratio; the same
  trust region on the summed log-prob would need a clip range about D times larger in log space.
  The mean is 1/D times the true log-density, so the policy gradient is scaled by 1/D (absorbed by
  Adam's scale invariance, and by the KL weight, which `mean_kl` puts on the same per-element scale).

  Where step_std <= 0 (noise_level 0: a deterministic step, a point mass with no density) the
  log-prob is NaN, not a stand-in value: it must not enter a ratio.

  Args:
    x_next: the next latents [B, ...] (as stored: the value the ratio is taken at), any float dtype.
    mu: the policy mean [B, ...] (`sde_step_mean`).
    step_std: scalar or [B], the step's noise std (`sde_std`'s second value).

  Returns:
    [B] float32.
  """
  x_next, mu = jnp.asarray(x_next), jnp.asarray(mu)
  same_shape("x_next", x_next, "mu", mu)
  axes = latent_axes(mu)
  std_B = jnp.broadcast_to(jnp.asarray(step_std, jnp.float32), (mu.shape[0],))
  std_b = per_sample("step_std", std_B, mu)
  diff = x_next.astype(jnp.float32) - mu.astype(jnp.float32)
  logp_BxD = -jnp.square(diff) / (2.0 * jnp.square(std_b)) - jnp.log(std_b) - _LOG_SQRT_2PI
  logp_B = jnp.mean(logp_BxD, axis=axes) if axes else logp_BxD
  return jnp.where(std_B > 0, logp_B, jnp.nan)


# What a step's log-prob is: "density", the Gaussian's log-density per latent element (`sde_logprob`); or
# "flow_grpo", Flow-GRPO's and FlowCPS's log-prob of a CPS step (`cps_reference_logprob`).
LOGPROBS = ("density", "flow_grpo")


def cps_reference_logprob(x_next, mu, step_std):
  """[B] -mean((x_next - mu)^2) over the latent dims: the log-prob Flow-GRPO gives a CPS step
  (yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py lines 85-89 at 54809b5: "remove all
  constants", then the mean over all but the batch dim), which IamCreateAI/FlowCPS keeps.

  It is `sde_logprob` times 2 step_std^2 up to a constant, so each log-ratio is the density's times 2 step_std^2:
  x1.46 at sigma' 0.9 with noise_level 0.8 (step_std = sigma' sin(0.4 pi)), x0.072 at sigma' 0.2: the clip
  reaches the low-noise steps later, and each step's gradient is weighted by its step_std^2. NaN where
  step_std <= 0, as `sde_logprob` (no noise: no likelihood to take a ratio of).
  """
  x_next, mu = jnp.asarray(x_next), jnp.asarray(mu)
  same_shape("x_next", x_next, "mu", mu)
  axes = latent_axes(mu)
  std_B = jnp.broadcast_to(jnp.asarray(step_std, jnp.float32), (mu.shape[0],))
  sq = jnp.square(x_next.astype(jnp.float32) - mu.astype(jnp.float32))
  logp_B = -(jnp.mean(sq, axis=axes) if axes else sq)
  return jnp.where(std_B > 0, logp_B, jnp.nan)


def step_logprob(kind: str, x_next, mu, step_std):
  """[B] the log-prob of `kind` (`LOGPROBS`) of the step to x_next: the one function the sampler and the learner
  both call."""
  if kind == "flow_grpo":
    return cps_reference_logprob(x_next, mu, step_std)
  if kind != "density":
    raise ValueError(f"logprob={kind!r} is not one of {list(LOGPROBS)}")
  return sde_logprob(x_next, mu, step_std)


def sde_step(x, v, sigma, sigma_next, noise_level, eps, sigma_guard=None, sde_type: str = "sde",
             logprob: str = "density"):
  """(x_next, logp): one SDE sampling step and the [B] log-prob of the step actually taken.

  x_next = mu + step_std * eps (`sde_step_mean`), rounded to v's dtype as `euler_step` rounds its
  result (the sampler keeps latents in the velocity's dtype), and logp = sde_logprob(x_next, mu,
  step_std) is taken at that rounded value: it is the log-prob a learner recomputes from the
  stored (x, x_next), so the on-policy ratio is exactly 1 when v is recomputed identically. The
  rounding of a bf16 velocity is then part of the sampled noise, not a mismatch between sampler and
  learner.

  noise_level == 0 (static): x_next is `euler_step(x, v, sigma, sigma_next)` bitwise and eps is
  not used; logp is NaN for every sample (the step is deterministic; it has no density, and NaN
  keeps it out of any ratio loudly). A traced noise_level that is 0 gives the same NaN logp.

  Args:
    x: latents [B, ...]; v: the (CFG-guided) velocity, x's shape.
    sigma, sigma_next, noise_level, sigma_guard: as in `sde_std`.
    eps: standard normal noise of x's shape (any float dtype; cast to float32).
    sde_type: "sde" (above) or "cps" (`cps_step_mean`'s mean and std; sigma_guard unused).
    logprob: which log-prob (`step_logprob`; "density" above).

  Returns:
    x_next [B, ...] in v's dtype, logp [B] float32.
  """
  x, v, eps = jnp.asarray(x), jnp.asarray(v), jnp.asarray(eps)
  same_shape("eps", eps, "x", x)
  mu, step_std = step_mean(sde_type, x, v, sigma, sigma_next, noise_level, sigma_guard)
  if is_static(noise_level) and noise_level == 0:
    x_next = mu.astype(v.dtype)
  else:
    x_next = (mu + per_sample("step_std", step_std, x) * eps.astype(jnp.float32)).astype(v.dtype)
  # XLA:GPU may keep a value in float32 inside a fusion where the program rounds it to bfloat16 (its "excess
  # precision"): on an H200 the ratio of a bfloat16 step was then 0.9993-1.0005. The barrier makes the log-prob
  # read x_next as stored.
  x_next = jax.lax.optimization_barrier(x_next)
  return x_next, step_logprob(logprob, x_next, mu, step_std)


def mean_kl(mu, mu_ref, step_std):
  """[B] KL(N(mu, s^2 I) || N(mu_ref, s^2 I)) / D = mean((mu - mu_ref)^2) / (2 s^2), s = step_std.

  Both policies step from the same x with the same noise, so the per-step KL is closed-form in the
  means. It is the exact KL of the step divided by the number D of latent elements: the same
  per-element scale as `sde_logprob` (the KL equals the expected difference of the two mean
  log-probs under the policy), so beta weighs it against the surrogate independently of resolution.

  The denominator: Flow-GRPO's training code (scripts/train_sd3.py line 895) divides the same mean
  by 2 * std_dev_t^2 where std_dev_t is the returned diffusion coefficient std_t
  (sd3_sde_with_logprob.py lines 47 and 70), without the sqrt(-dt): its value is this KL times -dt,
  i.e. the exact KL weighted by the step length. This function keeps the exact KL of the two step
  Gaussians, the quantity a KL coefficient is meant to weigh. To reproduce the reference code's
  number pass std_t (`sde_std`'s first value) as step_std; with Flow-GRPO's default beta = 0 the choice
  does not matter.

  Args:
    mu, mu_ref: the policy's and the reference policy's means [B, ...] at the same x.
    step_std: scalar or [B], > 0.

  Returns:
    [B] float32 (0 exactly where mu == mu_ref).
  """
  mu, mu_ref = jnp.asarray(mu), jnp.asarray(mu_ref)
  same_shape("mu_ref", mu_ref, "mu", mu)
  axes = latent_axes(mu)
  std_B = jnp.broadcast_to(jnp.asarray(step_std, jnp.float32), (mu.shape[0],))
  sq = jnp.square(mu.astype(jnp.float32) - mu_ref.astype(jnp.float32))
  sq_B = jnp.mean(sq, axis=axes) if axes else sq
  return sq_B / (2.0 * jnp.square(std_B))


def guard_log_ratio(logp_B, old_logp_B, mu, old_mu, step_std):
  """[B] GRPO-Guard's normalised log-ratio of one SDE step (Wang et al. 2025, "GRPO-Guard: Mitigating Implicit
  Over-Optimization in Flow Matching via Regulated Clipping", arXiv:2510.22319).

  s (logp - old_logp) + mean((mu - old_mu)^2) / (2 s), with s = step_std the step's noise std (std_t sqrt(-dt))
  and the means over the latent dims, as X-GenGroup/Flow-Factory writes it (trainers/grpo.py,
  `GRPOGuardTrainer.optimize`: `scale_factor`, `mse`, `ratio`). Why: with x' = old_mu + s eps (the step was
  sampled by the old policy) and `sde_logprob`'s per-element mean, logp - old_logp = mean(2 d (x' - old_mu) -
  d^2) / (2 s^2), d = mu - old_mu, whose expectation under the sampler is -mean(d^2) / (2 s^2) < 0: the ratio is
  biased low, and by 1/s^2, most at the low-noise steps, so the low clip fires there and the high one rarely
  does. Adding the bias back and multiplying by s leaves mean(d eps): zero-mean whatever the step, and its
  gradient s times the plain one (GRPO-Guard's per-step gradient reweighting). On-policy (old = stop_gradient
  of the new) the value is 0 exactly, the ratio exp(0) = 1.
  """
  logp_B, old_logp_B = jnp.asarray(logp_B, jnp.float32), jnp.asarray(old_logp_B, jnp.float32)
  mu, old_mu = jnp.asarray(mu, jnp.float32), jnp.asarray(old_mu, jnp.float32)
  same_shape("old_logp", old_logp_B, "logp", logp_B)
  same_shape("old_mu", old_mu, "mu", mu)
  std_B = jnp.broadcast_to(jnp.asarray(step_std, jnp.float32), logp_B.shape)
  axes = latent_axes(mu)
  mse_B = jnp.mean(jnp.square(mu - old_mu), axis=axes) if axes else jnp.square(mu - old_mu)
  return std_B * (logp_B - old_logp_B) + mse_B / (2.0 * std_B)


def flow_policy_loss(logp_B, old_logp_B, advantages_B, mask_B, *, clip_range, adv_clip_max, kl_B=None, beta=0.0):
  """Flow-GRPO's loss terms of one trained timestep: (numerator, denominator, aux) of a token-mean.

  Per sample: max(-A r, -A clip(r, 1 - clip_range, 1 + clip_range)) + beta KL, with r = exp(logp -
  old_logp), A the advantage clipped to [-adv_clip_max, adv_clip_max] and KL `mean_kl` (the reference
  train_sd3.py lines 884-896: `advantages` clipped by `adv_clip_max`, `ratio`, `unclipped_loss`,
  `clipped_loss`, `policy_loss + beta * kl_loss`). The reference averages each timestep's terms over the
  batch and accumulates the gradient over timesteps (equal weights); here numerator = sum over samples of
  mask x term and denominator = sum(mask): summed over the timesteps and micro-batches of an update
  and divided once, it is the mean over every (sample, timestep), which equals the reference's average
  when every step holds the same samples, and lets a masked (dropped) group out of every term exactly.

  The surrogate is `glmrl.grpo.policy_loss` on [B, 1] "tokens" (aggregation "token_mean", symmetric
  clip); the KL is added here since it is the closed-form Gaussian one, not a log-prob estimator.
  aux holds policy_loss's statistics plus "kl_mean" (masked mean of kl_B, 0 without it), its "numerator"
  the returned one (KL included).
  """
  logp_B, old_logp_B = jnp.asarray(logp_B), jnp.asarray(old_logp_B)
  if logp_B.ndim != 1:
    raise ValueError(f"logp must be [B], one log-prob per sample of one timestep, got {tuple(logp_B.shape)}")
  advantages = jnp.clip(jnp.asarray(advantages_B, jnp.float32), -adv_clip_max, adv_clip_max)
  mask_B = jnp.asarray(mask_B, jnp.float32)
  _, aux = policy_loss(logp_B[:, None], old_logp_B[:, None], advantages, mask_B[:, None],
                       epsilon_low=clip_range, epsilon_high=clip_range, aggregation="token_mean")
  numerator = aux["numerator"]
  if kl_B is not None:
    kl_B = jnp.asarray(kl_B, jnp.float32)
    same_shape("kl", kl_B, "logp", logp_B)
    numerator = numerator + jnp.asarray(beta, jnp.float32) * jnp.sum(kl_B * mask_B)
    aux = dict(aux, kl_mean=jnp.sum(kl_B * mask_B) / jnp.maximum(jnp.sum(mask_B), 1.0))
  return numerator, aux["denominator"], dict(aux, numerator=numerator)
