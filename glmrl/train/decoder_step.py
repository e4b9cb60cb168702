"""The decoder (DiT) policy update of Flow-GRPO: one jitted function over the trained timesteps.

The policy of one SDE step is the Gaussian of `glmrl.grpo.flow`; its mean comes from the CFG-guided
velocity (`decode.guided_velocity`, the sampler's own function: conditional and unconditional branch,
both under the trained parameters). As the AR update (`glmrl.train.step`), the first update of a
rollout takes old = stop_gradient(new) inside its own loss (ratio exp(0) = 1 exactly, per timestep)
and returns those log-probs for the later iterations.

The gradient is accumulated exactly over micro-batches and timesteps: each (micro-batch, timestep)
pair runs one guided forward and backward (two DiT passes), so activation memory is that of one
timestep of one micro-batch, and the summed float32 gradient divided by the total count is the
gradient of the mean over every (sample, timestep) of the rollout.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from flax import struct

from glmrl.grpo import flow
from glmrl.models import lora as lora_lib
from glmrl.sampling import decode
from glmrl.train.step import apply_accumulated, merge_micro, split_micro


@struct.dataclass
class DecoderRollout:
  """What the decoder update needs of one rollout (every leaf [B, ...], sharded over the batch axes)."""
  cond: decode.Conditioning   # the DiT conditioning of each sample
  target_size: jax.Array      # [B, 2]
  crop: jax.Array             # [B, 2]
  latents_before: jax.Array   # [B, W, C, h, w] x_t of each trained step
  latents_after: jax.Array    # [B, W, C, h, w] x_{t+1} the sampler drew
  sampler_logp: jax.Array     # [B, W] the sampler's log-probs (diagnostics)
  old_logp: jax.Array         # [B, W] the learner's, from the first update (NaN until then)
  advantages: jax.Array       # [B]
  mask: jax.Array             # [B, W] 1 in the loss, 0 for dropped groups


@struct.dataclass
class Window:
  """The trained steps' schedule ([W] each; data, so a moving window keeps one program)."""
  timesteps: jax.Array   # the DiT's timestep input at each trained step
  sigmas: jax.Array      # sigma_t
  sigmas_next: jax.Array  # sigma_{t+1}

  @classmethod
  def at(cls, model_timesteps_S, sigmas_S1, start, size: int) -> "Window":
    """The `size` steps from step `start` (traced) of a schedule."""
    cut = lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, size)
    return cls(cut(model_timesteps_S, start), cut(sigmas_S1, start), cut(sigmas_S1, start + 1))


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
  """Static description of the decoder update (part of the compiled program's identity)."""
  noise_level: float
  guidance_scale: float
  clip_range: float
  adv_clip_max: float
  beta: float
  micro_batches: int
  # The KL reference: "params" (a copy of the initial DiT, `ref_params`) or "adapters_off" (DiT LoRA).
  reference: str = "params"


def step_mean(graphdef, params, frozen, mb: DecoderRollout, window: Window, w, spec: DecoderSpec):
  """(mu [b, C, h, w], step_std) of the policy `params` at trained step w of the micro-batch."""
  # copy=True: fresh Variables for jax.grad's trace (as the AR update; see step.rollout_logprobs).
  dit = nnx.merge(graphdef, params, frozen, copy=True)
  x = mb.latents_before[:, w]
  v = decode.guided_velocity(dit, mb.cond, x, window.timesteps[w], spec.guidance_scale, mb.target_size, mb.crop)
  return flow.sde_step_mean(x, v, window.sigmas[w], window.sigmas_next[w], spec.noise_level)


def step_logprob(graphdef, params, frozen, mb: DecoderRollout, window: Window, w, spec: DecoderSpec):
  """[b] log-probs of the recorded step x_t -> x_{t+1} at trained step w under `params` (the one function
  the old and new log-probs both come from)."""
  mu, std = step_mean(graphdef, params, frozen, mb, window, w, spec)
  return flow.sde_logprob(mb.latents_after[:, w], mu, std), mu, std


def _timestep_loss(params, graphdef, frozen, mb, window, w, mu_ref, first, spec):
  logp, mu, std = step_logprob(graphdef, params, frozen, mb, window, w, spec)
  old = jnp.where(first, jax.lax.stop_gradient(logp), mb.old_logp[:, w])
  kl = None if mu_ref is None else flow.mean_kl(mu, mu_ref, std)
  numerator, denominator, aux = flow.flow_policy_loss(
      logp, old, mb.advantages, mb.mask[:, w], clip_range=spec.clip_range, adv_clip_max=spec.adv_clip_max,
      kl_B=kl, beta=spec.beta)
  return numerator, (dict(aux, denominator=denominator), old)


_MEAN_STATS = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean")


def accumulate_gradients(graphdef, params, frozen, rollout: DecoderRollout, window: Window, ref_params, first, *,
                         spec: DecoderSpec):
  """(summed float32 gradient of the numerators, statistics, old_logp [B, W]) over micro-batches x steps."""
  grad_fn = jax.grad(_timestep_loss, has_aux=True)
  if spec.reference == "adapters_off":
    ref_params = lora_lib.adapters_off(params)
  use_kl = spec.beta > 0
  steps = window.timesteps.shape[0]

  def timestep(carry, w, mb):
    grads_acc, stats = carry
    mu_ref = None
    if use_kl:
      mu_ref, _ = step_mean(graphdef, ref_params, frozen, mb, window, w, spec)
      mu_ref = jax.lax.stop_gradient(mu_ref)
    grads, (aux, old) = grad_fn(params, graphdef, frozen, mb, window, w, mu_ref, first, spec)
    count = aux["denominator"]
    new_stats = {k: stats[k] + aux[k] * count for k in _MEAN_STATS}
    new_stats.update(numerator=stats["numerator"] + aux["numerator"],
                     denominator=stats["denominator"] + count,
                     ratio_min=jnp.minimum(stats["ratio_min"], aux["ratio_min"]),
                     ratio_max=jnp.maximum(stats["ratio_max"], aux["ratio_max"]))
    grads_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_acc, grads)
    return (grads_acc, new_stats), old

  def micro_batch(carry, mb):
    carry, old_WxB = jax.lax.scan(lambda c, w: timestep(c, w, mb), carry, jnp.arange(steps))
    return carry, old_WxB.T

  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  init = {k: jnp.zeros((), jnp.float32) for k in _MEAN_STATS + ("numerator", "denominator")}
  init.update(ratio_min=jnp.array(jnp.inf, jnp.float32), ratio_max=jnp.array(-jnp.inf, jnp.float32))
  (grads_sum, stats), old_MxBxW = jax.lax.scan(micro_batch, (zeros, init), split_micro(rollout, spec.micro_batches))
  return grads_sum, stats, merge_micro(old_MxBxW)


def update(graphdef, params, frozen, opt_state, rollout: DecoderRollout, window: Window, ref_params=None, first=True,
           *, spec: DecoderSpec, tx: optax.GradientTransformation, schedule):
  """One optimizer step of the DiT on the rollout's trained steps; returns (params, opt_state, metrics, old_logp).

  A non-finite loss or gradient leaves params and optimizer state untouched and reports `skipped = 1`.
  """
  grads_sum, stats, old_logp = accumulate_gradients(graphdef, params, frozen, rollout, window, ref_params, first,
                                                    spec=spec)
  # Every (sample, step) in the loss counts once: the statistics' means are over the denominator.
  new_params, new_opt_state, metrics = apply_accumulated(tx, schedule, params, opt_state, grads_sum, stats,
                                                         jnp.maximum(stats["denominator"], 1.0))
  return new_params, new_opt_state, metrics, old_logp


def make_update(graphdef, spec: DecoderSpec, tx, schedule, *, param_shardings=None, opt_shardings=None):
  """`update` jitted once, params and optimizer state donated; called as
  fn(params, frozen, opt_state, rollout, window, ref_params, first)."""
  fn = functools.partial(update, graphdef, spec=spec, tx=tx, schedule=schedule)
  out_shardings = None if param_shardings is None else (param_shardings, opt_shardings, None, None)
  return jax.jit(fn, donate_argnums=(0, 2), out_shardings=out_shardings)
