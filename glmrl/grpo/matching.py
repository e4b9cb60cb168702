"""Likelihood-free decoder RL on the forward (noising) process: DiffusionNFT, Advantage Weighted Matching and DGPO.

Both train on the clean latents x0 of a rollout sampled by any solver (here the ODE): at a timestep with
flow time sigma they noise x0 with fresh eps, x_sigma = (1 - sigma) x0 + sigma eps, whose flow-matching
velocity target is v* = eps - x0 (the convention of the sampler's Euler step x <- x + (sigma' - sigma) v),
and compare the DiT's velocity there with v*. No SDE, no trajectory, no log-density.

- DiffusionNFT (Zheng et al. 2025, arXiv:2509.16117; github.com/NVlabs/DiffusionNFT,
  scripts/train_nft_sd3.py lines 927-960): with the old (slowly updated) policy's velocity v_old and the
  trained one's v, the implicit positive and negative policies v+ = b v + (1 - b) v_old and
  v- = (1 + b) v_old - b v are each regressed onto the data through their x0 predictions
  x0+- = x_sigma - sigma v+-, weighted by r, the advantage mapped to an optimality probability in [0, 1]:
  loss = scale (r |x0+ - x0|^2 / w+ + (1 - r) |x0- - x0|^2 / w-) / b, each norm a mean over the latent and
  w = stop_gradient(mean |x0+- - x0|) (>= 1e-5) the reference's adaptive weight, scale = adv_clip_max.
- AWM (Xue et al. 2025, arXiv:2509.25050): the flow-matching loss of the rollout's own samples as a
  log-likelihood surrogate, logp = -w(sigma) mean((v - v*)^2), in a PPO ratio exp(logp - old_logp) with the
  rollout's advantages (Flow-Factory's trainers/awm.py; the ratio loss is `flow.flow_policy_loss`).
- DGPO (Luo et al. 2025, Direct Group Preference Optimization; github.com/Luo-Yihong/DGPO): the flow error of
  each sample weighted by its advantage and its group's DPO weight (`dgpo_group_weights`).

Shapes: x0, eps, v [B, ...]; sigma, r, advantages [B]. All pure, float32, jit-able.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from glmrl.grpo._checks import latent_axes, per_sample, same_shape

AWM_WEIGHTINGS = ("uniform", "t", "t2", "ghuber")
_GHUBER_FLOOR = 1e-10  # keeps (mse + floor)^p finite in its gradient at mse = 0, as AWM's code


def noised(x0, eps, sigma_B):
  """x_sigma = (1 - sigma) x0 + sigma eps [B, ...] float32: the forward process at flow time sigma."""
  same_shape("eps", eps, "x0", x0)
  s = per_sample("sigma", sigma_B, x0)
  return (1.0 - s) * x0.astype(jnp.float32) + s * eps.astype(jnp.float32)


def velocity_target(x0, eps):
  """v* = eps - x0: d x_sigma / d sigma, what the DiT's velocity regresses onto."""
  return eps.astype(jnp.float32) - x0.astype(jnp.float32)


def optimality(advantages_B, adv_clip_max):
  """r = clip((clip(A, -m, m) / m) / 2 + 1/2, 0, 1): an advantage as the probability the sample is better than
  its group (0.5 for the mean; DiffusionNFT's `normalized_advantages_clip`)."""
  a = jnp.clip(jnp.asarray(advantages_B, jnp.float32), -adv_clip_max, adv_clip_max)
  return jnp.clip(a / adv_clip_max / 2.0 + 0.5, 0.0, 1.0)


def _weighted_x0_error(v, x_t, x0, sigma_b):
  """mean((x0_pred - x0)^2) / stop_gradient(mean |x0_pred - x0|) per sample, x0_pred = x_t - sigma v."""
  err = (x_t - sigma_b * v) - x0
  weight = jax.lax.stop_gradient(jnp.maximum(jnp.mean(jnp.abs(err), axis=latent_axes(err)), 1e-5))
  return jnp.mean(jnp.square(err), axis=latent_axes(err)) / weight


def nft_loss(v, v_old, x0, x_t, sigma_B, r_B, *, beta, scale):
  """[B] DiffusionNFT loss of each sample at one timestep (see the module docstring).

  Args:
    v: the trained policy's velocity at x_t [B, ...] (gradient flows through it).
    v_old: the old policy's velocity at the same x_t (held constant).
    x0: the clean latents; x_t: `noised(x0, eps, sigma)`; sigma_B: flow time of each sample.
    r_B: optimality probabilities (`optimality`).
    beta: b in (0, 1], the step from the old policy to the implicit ones.
    scale: the reference's loss multiplier (its adv_clip_max).
  """
  for name, x in (("v_old", v_old), ("x0", x0), ("x_t", x_t)):
    same_shape(name, x, "v", v)
  f32 = jnp.float32
  v, v_old, x0, x_t = v.astype(f32), jax.lax.stop_gradient(v_old.astype(f32)), x0.astype(f32), x_t.astype(f32)
  sigma_b = per_sample("sigma", sigma_B, v)
  positive = beta * v + (1.0 - beta) * v_old
  negative = (1.0 + beta) * v_old - beta * v
  r = jnp.asarray(r_B, f32)
  return scale * (r * _weighted_x0_error(positive, x_t, x0, sigma_b)
                  + (1.0 - r) * _weighted_x0_error(negative, x_t, x0, sigma_b)) / beta


def awm_logprob(v, target, sigma_B, weighting: str = "uniform", ghuber_power: float = 0.25):
  """[B] AWM's log-likelihood surrogate of the flow-matching error mse = mean((v - v*)^2): -w(sigma) mse with
  w = 1 ("uniform"), sigma ("t") or sigma^2 ("t2"); or "ghuber", AWM's released weighting (scxue/
  advantage_weighted_matching, scripts/train_sd3_awm.py lines 248-249 at be51372):
  -sigma ((mse + 1e-10)^p - 1e-10^p) / p with p = `ghuber_power` (0.25): a generalised Huber loss, the plain
  one's gradient scaled by sigma (mse + 1e-10)^(p - 1), so samples the model already fits weigh more."""
  same_shape("target", target, "v", v)
  mse = jnp.mean(jnp.square(v.astype(jnp.float32) - target.astype(jnp.float32)), axis=latent_axes(v))
  sigma = jnp.asarray(sigma_B, jnp.float32)
  if weighting == "ghuber":
    p = jnp.asarray(ghuber_power, jnp.float32)
    return -sigma * (jnp.power(mse + _GHUBER_FLOOR, p) - jnp.power(jnp.float32(_GHUBER_FLOOR), p)) / p
  w = {"uniform": jnp.ones_like(sigma), "t": sigma, "t2": jnp.square(sigma)}[weighting]
  return -w * mse


def rescaled_advantages(advantages_B, adv_clip_max, advantage_max):
  """[B] AWM's advantages as its loss takes them: clipped to [-m, m], m = adv_clip_max, then scaled by
  advantage_max / m (its released advantage_max 1: into [-1, 1]; scripts/train_sd3_awm.py lines 1292-1299)."""
  m = jnp.float32(adv_clip_max)
  return jnp.clip(jnp.asarray(advantages_B, jnp.float32), -m, m) / m * jnp.float32(advantage_max)


def velocity_kl(v, v_ref):
  """[B] mean((v - v_ref)^2) over the latent: the velocity-space KL proxy both references use (for two
  Gaussians of equal variance it is the KL up to a constant factor)."""
  same_shape("v_ref", v_ref, "v", v)
  return jnp.mean(jnp.square(v.astype(jnp.float32) - jax.lax.stop_gradient(v_ref.astype(jnp.float32))),
                  axis=latent_axes(v))


def flow_error(v, target):
  """[B] mean((v - v*)^2) over the latent: the denoising (flow-matching) error of one sample at one timestep."""
  same_shape("target", target, "v", v)
  return jnp.mean(jnp.square(v.astype(jnp.float32) - target.astype(jnp.float32)), axis=latent_axes(v))


def dgpo_group_weights(delta_BxW, advantages_B, group_size: int, beta_dpo: float):
  """[B, W] DGPO's weights (Luo et al. 2025, Direct Group Preference Optimization; Luo-Yihong/DGPO
  scripts/train_sd3_dgpo.py lines 162-193 at 01ceb4b): per group g and trained step, sigmoid(S_g) with
  S_g = sum_{i in g} A_i beta_dpo delta_i / G, delta_i = the policy's flow error minus the reference's (no gradient),
  given to every member of the group. The loss sum_i w_g(i) A_i error_i then has the gradient of the group's
  -log sigmoid(-S_g), the DPO loss of its advantage-weighted preference (samples above the group mean as winners,
  below as losers, each by |A_i|). Rows of a group are consecutive (`group_size` of them)."""
  delta = jax.lax.stop_gradient(jnp.asarray(delta_BxW, jnp.float32))
  b, w = delta.shape
  if b % group_size:
    raise ValueError(f"{b} rows do not split into groups of {group_size}")
  adv = jnp.asarray(advantages_B, jnp.float32)[:, None]
  s_PxW = jnp.sum((adv * beta_dpo * delta / group_size).reshape(b // group_size, group_size, w), axis=1)
  return jnp.repeat(jax.nn.sigmoid(s_PxW), group_size, axis=0)

