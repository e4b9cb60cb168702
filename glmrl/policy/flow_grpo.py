"""Flow-GRPO on the DiT (config.decoder.algorithm 'flow_grpo'): its rollout leg (the SDE window of its denoising
steps), its batch and that batch's abstract shapes, its spec, its update (one jitted function over the trained
timesteps) and the bound policy (`FlowGrpoPolicy`).

The policy of one SDE step is the Gaussian of `glmrl.grpo.flow`; its mean comes from the CFG-guided
velocity (`decode.guided_velocity`, the sampler's own function: conditional and unconditional branch,
both under the trained parameters). As the AR update (`glmrl.policy.ar`), the first update of a
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
from flax import nnx
from flax import struct

from glmrl.grpo import flow
from glmrl.models import lora as lora_lib
from glmrl.policy import accumulate
from glmrl.policy import dit
from glmrl.sampling import decode
from glmrl.sampling.pipeline import SdeRequest


@struct.dataclass
class FlowRollout:
  """What the Flow-GRPO update needs of one rollout (every leaf [B, ...], sharded over the batch axes)."""
  cond: decode.Conditioning   # the DiT conditioning of each sample
  target_size: jax.Array      # [B, 2]
  crop: jax.Array             # [B, 2]
  latents_before: jax.Array   # [B, W, C, h, w] x_t of each trained step
  latents_after: jax.Array    # [B, W, C, h, w] x_{t+1} the sampler drew
  sampler_logp: jax.Array     # [B, W] the sampler's log-probs (diagnostics)
  old_logp: jax.Array         # [B, W] the learner's, from the first update (NaN until then)
  advantages: jax.Array       # [B]
  mask: jax.Array             # [B, W] 1 in the loss, 0 for dropped groups
  # [B, W, C, h, w] the learner's step means from the first update (GRPO-Guard's old mean; None without it)
  old_mean: jax.Array | None = None


@struct.dataclass
class Window:
  """The trained steps' schedule ([W] each; data, so a moving window keeps one program)."""
  timesteps: jax.Array   # the DiT's timestep input at each trained step
  sigmas: jax.Array      # sigma_t
  sigmas_next: jax.Array  # sigma_{t+1}

  @classmethod
  def at(cls, model_timesteps_s, sigmas_e, start, size: int) -> "Window":
    """The `size` steps from step `start` (traced) of a schedule."""
    cut = lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, size)
    return cls(cut(model_timesteps_s, start), cut(sigmas_e, start), cut(sigmas_e, start + 1))


@struct.dataclass
class FlowBatch:
  """The Flow-GRPO update's input: the rollout's rows and the trained steps' schedule."""
  rollout: FlowRollout
  window: Window


@dataclasses.dataclass(frozen=True)
class FlowSpec:
  """Static description of the Flow-GRPO update (part of the compiled program's identity)."""
  noise_level: float
  guidance_scale: float
  clip_range: float
  adv_clip_max: float
  beta: float
  micro_batches: int
  # The KL reference: "params" (a copy of the initial DiT, `ref_params`) or "adapters_off" (DiT LoRA).
  reference: str = "params"
  sde_type: str = "sde"  # the stochastic step: "sde" or "cps" (`glmrl.grpo.flow.step_mean`)
  ratio_norm: bool = False  # GRPO-Guard's normalised ratio (`glmrl.grpo.flow.guard_log_ratio`)
  logprob: str = "density"  # the steps' log-prob (`glmrl.grpo.flow.step_logprob`), the sampler's own


def step_mean(graphdef, params, frozen, mb: FlowRollout, window: Window, w, spec: FlowSpec):
  """(mu [b, C, h, w], step_std) of the policy `params` at trained step w of the micro-batch."""
  # copy=True: fresh Variables for jax.grad's trace (as the AR update; see step.rollout_logprobs).
  dit = nnx.merge(graphdef, params, frozen, copy=True)
  x = mb.latents_before[:, w]
  v = decode.guided_velocity(dit, mb.cond, x, window.timesteps[w], spec.guidance_scale, mb.target_size, mb.crop)
  return flow.step_mean(spec.sde_type, x, v, window.sigmas[w], window.sigmas_next[w], spec.noise_level)


def step_logprob(graphdef, params, frozen, mb: FlowRollout, window: Window, w, spec: FlowSpec):
  """[b] log-probs of the recorded step x_t -> x_{t+1} at trained step w under `params` (the one function
  the old and new log-probs both come from)."""
  mu, std = step_mean(graphdef, params, frozen, mb, window, w, spec)
  return flow.step_logprob(spec.logprob, mb.latents_after[:, w], mu, std), mu, std


def _timestep_loss(params, graphdef, frozen, mb, window, w, mu_ref, first, spec):
  logp, mu, std = step_logprob(graphdef, params, frozen, mb, window, w, spec)
  old = jnp.where(first, jax.lax.stop_gradient(logp), mb.old_logp[:, w])
  kl = None if mu_ref is None else flow.mean_kl(mu, mu_ref, std)
  old_mu, new, reference = None, logp, old
  if spec.ratio_norm:
    # The log-ratio itself goes in as "logp" against 0: exp(new - 0) is GRPO-Guard's ratio.
    old_mu = jnp.where(first, jax.lax.stop_gradient(mu), mb.old_mean[:, w])
    new, reference = flow.guard_log_ratio(logp, old, mu, old_mu, std), jnp.zeros_like(logp)
  numerator, denominator, aux = flow.flow_policy_loss(
      new, reference, mb.advantages, mb.mask[:, w], clip_range=spec.clip_range, adv_clip_max=spec.adv_clip_max,
      kl_B=kl, beta=spec.beta)
  return numerator, (dict(aux, denominator=denominator), (old, old_mu))


_MEAN_STATS = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean")


def accumulate_gradients(graphdef, params, frozen, batch: FlowBatch, ref_params, first, *, spec: FlowSpec):
  """(summed float32 gradient of the numerators, statistics, (old_logp [B, W], old_mean [B, W, C, h, w] or
  None)) over micro-batches x steps."""
  window = batch.window
  grad_fn = jax.grad(_timestep_loss, has_aux=True)
  if spec.reference == "adapters_off":
    ref_params = lora_lib.adapters_off(params)
  use_kl = spec.beta > 0
  steps = window.timesteps.shape[0]

  def timestep(carry, mb, w):
    mu_ref = None
    if use_kl:
      mu_ref, _ = step_mean(graphdef, ref_params, frozen, mb, window, w, spec)
      mu_ref = jax.lax.stop_gradient(mu_ref)
    grads, (aux, old) = grad_fn(params, graphdef, frozen, mb, window, w, mu_ref, first, spec)
    return accumulate.add(carry, grads, aux, aux["denominator"], _MEAN_STATS), old

  (grads_sum, stats), old = accumulate.scan_steps(timestep, accumulate.init(params, _MEAN_STATS), batch.rollout,
                                                  spec.micro_batches, steps)
  return grads_sum, stats, old


update = functools.partial(dit.update, accumulate_gradients)


def window_starts(config) -> tuple[int, int]:
  """(first, last) step a random SDE window may start at: it lies within decoder.window_range = [lo, hi), hi 0
  meaning the first half of the steps (Flow-GRPO's newer recipe), never holding the final step (checked by
  `glmrl.config.cross_checks`)."""
  d = config.decoder
  lo, hi = tuple(d.window_range)
  hi = hi or min(max(d.train_steps // 2, lo + d.window_size), d.train_steps - 1)
  return lo, hi - d.window_size


def window_start(config, key, step: int = 0):
  """The SDE window's first step at rollout step `step`: config.decoder.window_start; or with
  decoder.window_slide_every = n > 0, MixGRPO's progressive sliding window (Li et al. 2025, arXiv:2507.21802;
  `GRPOTrainingStates`, sample_strategy "progressive", in Tencent-Hunyuan's MixGRPO fastvideo/utils/grpo_states.py):
  from the first start of `window_starts`, moved by decoder.window_slide_stride steps every n rollout steps, held
  at the last start (or, with window_slide_roll_back, back to the first); else (-1) uniform over `window_starts`.
  A function of the step, so a resumed run slides as an uninterrupted one."""
  d = config.decoder
  if d.window_start >= 0:
    return jnp.asarray(d.window_start, jnp.int32)
  first, last = window_starts(config)
  if d.window_slide_every > 0:
    stride = d.window_slide_stride or d.window_size
    moved = (step // d.window_slide_every) * stride
    if d.window_slide_roll_back:
      # MixGRPO rolls back once the start passes the last one: the starts first, first + stride, ... <= last.
      moved %= ((last - first) // stride + 1) * stride
    return jnp.asarray(min(first + moved, last), jnp.int32)
  return jax.random.randint(key, (), first, last + 1, jnp.int32)


class FlowGrpoPolicy(dit.DitPolicy):
  """Flow-GRPO on the DiT, bound to the run's config: groups of one token grid's SDE samples."""

  def spec(self, images: int) -> FlowSpec:
    """The static description of its update on `images` rows."""
    d, settings = self.config.decoder, self.settings
    return FlowSpec(
        noise_level=float(d.noise_level), guidance_scale=self.guidance, clip_range=float(d.clip_range),
        adv_clip_max=float(d.adv_clip_max), beta=settings.beta, micro_batches=settings.micro_batches(images),
        reference=settings.reference, sde_type=d.sde_type, ratio_norm=bool(d.ratio_norm), logprob=d.logprob)

  def sde(self) -> decode.SdeWindow:
    d = self.config.decoder
    return decode.SdeWindow(noise_level=float(d.noise_level), size=d.window_size, sde_type=d.sde_type,
                            logprob=d.logprob)

  def rollout_leg(self, run, prepared, sample, key, dit_params, step: int, on_images=None) -> tuple:
    """(images, FlowBatch of the recorded window steps (learner log-probs, advantages and mask still empty),
    metrics): the SDE window at its start for rollout step `step` (fixed, sliding or random)."""
    pipeline, d = run.pipeline, self.config.decoder
    noise_key, window_key = jax.random.split(key)
    target_B, latents, noise_keys_B, cond = self.leg_inputs(run, prepared, sample, noise_key)
    start = window_start(self.config, window_key, step)
    images, _, trajectory = self.decode(run, prepared, target_B, latents, cond, dit_params,
                                        sde=SdeRequest(self.sde(), start, noise_keys_B), on_images=on_images)
    window = Window.at(*pipeline.schedule(self.train_steps), start, d.window_size)
    batch_first = lambda x_WxB: pipeline.shard_batch(jnp.swapaxes(x_WxB, 0, 1))
    rollout = FlowRollout(
        **self.rows(pipeline, cond), latents_before=batch_first(trajectory.latents_before),
        latents_after=batch_first(trajectory.latents_after), sampler_logp=batch_first(trajectory.sampler_logp),
        old_logp=None, advantages=None, mask=None)
    return images, FlowBatch(rollout, window), {"window_start": start.astype(jnp.float32)}

  def abstract_leg(self, run, chunk: int) -> tuple:
    """The decode program's SDE arguments for a chunk of `chunk` images: the window, noise keys, its start."""
    return self.sde(), run.batch_keys(chunk), run.replicated((), jnp.int32)

  def rollout_batch(self, sampled, advantages, keep) -> FlowBatch:
    batch = sampled.legs[self.name]
    rollout = batch.rollout.replace(
        old_logp=jnp.full_like(batch.rollout.sampler_logp, jnp.nan), advantages=advantages,
        mask=jnp.broadcast_to(keep[:, None], (keep.shape[0], self.config.decoder.window_size)),
        # GRPO-Guard's old means, filled by the first update (one program for every iteration).
        old_mean=jnp.full_like(batch.rollout.latents_after, jnp.nan, jnp.float32) if self.config.decoder.ratio_norm
        else None)
    return batch.replace(rollout=rollout)

  def abstract_inputs(self, run) -> tuple:
    """(update shape, FlowBatch) of its update, abstract: the SDE window's steps of every image."""
    b, steps = run.images, self.config.decoder.window_size
    per_step = run.batch_array((b, steps), jnp.float32)
    latents = run.batch_array((b, steps, *run.latent_shape), jnp.float32)
    rollout = FlowRollout(
        **self.abstract_rows(run, b), latents_before=latents, latents_after=latents, sampler_logp=per_step,
        old_logp=per_step, advantages=run.batch_array((b,), jnp.float32), mask=per_step,
        old_mean=latents if self.config.decoder.ratio_norm else None)
    window = Window(*(run.replicated((steps,), jnp.float32) for _ in range(3)))
    return (b,), FlowBatch(rollout, window)

  def update_shape(self, sampled) -> tuple:
    return (sampled.legs[self.name].rollout.sampler_logp.shape[0],)

  def after_first(self, batch: FlowBatch, outputs) -> tuple[FlowBatch, dict]:
    rollout = batch.rollout
    # The sampler's log-probs vs the learner's of the same steps: one guided velocity function, two programs.
    old_logp, old_mean = outputs
    metrics = {"logprob/sampler_vs_recomputed_max_abs": jnp.max(jnp.abs(rollout.sampler_logp - old_logp))}
    return batch.replace(rollout=rollout.replace(old_logp=old_logp, old_mean=old_mean)), metrics

  def trained_steps(self) -> int:
    """Denoising steps its update trains per image: the SDE window."""
    return self.config.decoder.window_size

  def anchor_passes(self, images: int) -> int:
    """The DiT forwards its update adds per trained step beside its own: the reference's under a KL."""
    del images
    return int(self.settings.beta > 0)

  update = staticmethod(update)
