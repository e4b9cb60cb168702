"""The decoder (DiT) policy: Flow-GRPO on the SDE window of its denoising steps (config.decoder.algorithm
'flow_grpo'; the likelihood-free algorithms are `decoder_matching.py`). Its rollout batch, its spec,
its update (one jitted function over the trained timesteps) and the `Policy` object the run calls (`POLICY`).

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

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from flax import struct

from glmrl.checkpoint.manager import DECODER_EMA, DECODER_LORA_FILE, DECODER_OPT_STATE, DECODER_PARAMS
from glmrl.grpo import flow
from glmrl.models import lora as lora_lib
from glmrl.policy import accumulate
from glmrl.policy import ema as ema_lib
from glmrl.policy.base import Request, Settings, lora_alpha
from glmrl.sampling import decode


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
  # [B, W, C, h, w] the learner's step means from the first update (GRPO-Guard's old mean; None without it)
  old_mean: jax.Array | None = None


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


@struct.dataclass
class DecoderBatch:
  """The decoder update's input: the rollout's rows and the trained steps' schedule."""
  rollout: DecoderRollout
  window: Window


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
  sde_type: str = "sde"  # the stochastic step: "sde" or "cps" (`glmrl.grpo.flow.step_mean`)
  ratio_norm: bool = False  # GRPO-Guard's normalised ratio (`glmrl.grpo.flow.guard_log_ratio`)


def step_mean(graphdef, params, frozen, mb: DecoderRollout, window: Window, w, spec: DecoderSpec):
  """(mu [b, C, h, w], step_std) of the policy `params` at trained step w of the micro-batch."""
  # copy=True: fresh Variables for jax.grad's trace (as the AR update; see step.rollout_logprobs).
  dit = nnx.merge(graphdef, params, frozen, copy=True)
  x = mb.latents_before[:, w]
  v = decode.guided_velocity(dit, mb.cond, x, window.timesteps[w], spec.guidance_scale, mb.target_size, mb.crop)
  return flow.step_mean(spec.sde_type, x, v, window.sigmas[w], window.sigmas_next[w], spec.noise_level)


def step_logprob(graphdef, params, frozen, mb: DecoderRollout, window: Window, w, spec: DecoderSpec):
  """[b] log-probs of the recorded step x_t -> x_{t+1} at trained step w under `params` (the one function
  the old and new log-probs both come from)."""
  mu, std = step_mean(graphdef, params, frozen, mb, window, w, spec)
  return flow.sde_logprob(mb.latents_after[:, w], mu, std), mu, std


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


def accumulate_gradients(graphdef, params, frozen, rollout: DecoderRollout, window: Window, ref_params, first, *,
                         spec: DecoderSpec):
  """(summed float32 gradient of the numerators, statistics, (old_logp [B, W], old_mean [B, W, C, h, w] or
  None)) over micro-batches x steps."""
  grad_fn = jax.grad(_timestep_loss, has_aux=True)
  if spec.reference == "adapters_off":
    ref_params = lora_lib.adapters_off(params)
  use_kl = spec.beta > 0
  steps = window.timesteps.shape[0]

  def timestep(carry, w, mb):
    mu_ref = None
    if use_kl:
      mu_ref, _ = step_mean(graphdef, ref_params, frozen, mb, window, w, spec)
      mu_ref = jax.lax.stop_gradient(mu_ref)
    grads, (aux, old) = grad_fn(params, graphdef, frozen, mb, window, w, mu_ref, first, spec)
    return accumulate.add(carry, grads, aux, aux["denominator"], _MEAN_STATS), old

  def micro_batch(carry, mb):
    carry, old_W = jax.lax.scan(lambda c, w: timestep(c, w, mb), carry, jnp.arange(steps))
    return carry, jax.tree.map(lambda x_WxB: jnp.swapaxes(x_WxB, 0, 1), old_W)

  (grads_sum, stats), old_M = jax.lax.scan(micro_batch, accumulate.init(params, _MEAN_STATS),
                                           accumulate.split_micro(rollout, spec.micro_batches))
  return grads_sum, stats, jax.tree.map(accumulate.merge_micro, old_M)


def update(graphdef, params, frozen, opt_state, batch: DecoderBatch, ref_params=None, first=True, *,
           spec: DecoderSpec, tx: optax.GradientTransformation, schedule):
  """One optimizer step of the DiT on the rollout's trained steps; returns (params, opt_state, metrics,
  (old_logp, old_mean or None)).

  A non-finite loss or gradient leaves params and optimizer state untouched and reports `skipped = 1`.
  """
  grads_sum, stats, old = accumulate_gradients(graphdef, params, frozen, batch.rollout, batch.window,
                                               ref_params, first, spec=spec)
  # Every (sample, step) in the loss counts once: the statistics' means are over the denominator.
  new_params, new_opt_state, metrics = accumulate.apply(tx, schedule, params, opt_state, grads_sum, stats,
                                                        jnp.maximum(stats["denominator"], 1.0))
  return new_params, new_opt_state, metrics, old


def train_guidance(config) -> float:
  """The CFG scale of the decoder's training rollouts and loss: config.decoder.train_guidance, unset (0) the
  sampling scale; 1.0 is CFG-free (one DiT pass per step)."""
  return float(config.decoder.train_guidance or config.sampling.guidance_scale)


def micro_batches(config, images: int) -> int:
  return images // (POLICY.settings(config).micro_batch_size or images)


def decoder_spec(config, images: int) -> DecoderSpec:
  """The static description of the run's decoder update on `images` rows."""
  d, settings = config.decoder, POLICY.settings(config)
  return DecoderSpec(
      noise_level=float(d.noise_level), guidance_scale=train_guidance(config),
      clip_range=float(d.clip_range), adv_clip_max=float(d.adv_clip_max), beta=settings.beta,
      micro_batches=micro_batches(config, images),
      reference="adapters_off" if settings.lora.enabled else "params", sde_type=d.sde_type,
      ratio_norm=bool(d.ratio_norm))


def window_starts(config) -> tuple[int, int]:
  """(first, last) step a random SDE window may start at: it lies within decoder.window_range = [lo, hi), hi 0
  meaning the first half of the steps (Flow-GRPO's newer recipe), never holding the final step (checked by
  `config_checks`)."""
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


class DecoderPolicy:
  """Flow-GRPO on the DiT (`glmrl.policy.base.Policy`): groups of one token grid's SDE samples."""
  name = "decoder"
  component = "dit"
  params_item, opt_item, ema_item = DECODER_PARAMS, DECODER_OPT_STATE, DECODER_EMA
  adapters_file = DECODER_LORA_FILE
  lora_section = "config.decoder.lora"
  salt = 0xD17
  full_filter = nnx.Param

  micro_batch_key = "config.decoder.micro_batch_size"

  def rows_per_prompt(self, request: Request) -> int:
    """Rows of its update per prompt: one per image."""
    return request.images_per_prompt

  def rewards(self, config, request: Request) -> tuple:
    """(its reward entries, the rows a per-group normalisation spans: a token grid's samples)."""
    return config.decoder.rewards, request.samples_per_grid

  def settings(self, config) -> Settings:
    d = config.decoder
    return Settings(group_size=d.group_size,
                    lora=lora_lib.LoraConfig(rank=d.lora.rank, alpha=lora_alpha(d.lora),
                                             targets=lora_lib.target_patterns(d.lora.targets)),
                    optim=d.optim, num_iterations=d.num_iterations, beta=float(d.beta),
                    micro_batch_size=d.micro_batch_size,
                    ema=ema_lib.EmaSettings(decay=float(d.ema.decay), every=d.ema.every, ramp=float(d.ema.ramp)),
                    advantage_scale=d.adv_std)

  def request(self, config) -> Request:
    return Request(samples_per_grid=config.decoder.group_size, sde=True)

  def prefix(self, policies) -> str:
    del policies
    return "decoder/"

  def group_rewards(self, total_B, request: Request):
    return total_B, request.samples_per_grid

  def rollout_batch(self, config, sampled, advantages, keep) -> DecoderBatch:
    sde = sampled.sde
    rollout = sde.rollout.replace(
        old_logp=jnp.full_like(sde.rollout.sampler_logp, jnp.nan), advantages=advantages,
        mask=jnp.broadcast_to(keep[:, None], (keep.shape[0], config.decoder.window_size)),
        # GRPO-Guard's old means, filled by the first update (one program for every iteration).
        old_mean=jnp.full_like(sde.rollout.latents_after, jnp.nan, jnp.float32) if config.decoder.ratio_norm
        else None)
    return DecoderBatch(rollout, sde.window)

  def update_shape(self, sampled) -> tuple:
    return (sampled.sde.rollout.sampler_logp.shape[0],)

  def make_update(self, state, config, shape):
    images, = shape
    return state.jit_update(update, decoder_spec(config, images))

  def after_first(self, batch: DecoderBatch, outputs, config) -> tuple[DecoderBatch, dict]:
    del config
    rollout = batch.rollout
    # The sampler's log-probs vs the learner's of the same steps: one guided velocity function, two programs.
    old_logp, old_mean = outputs
    metrics = {"logprob/sampler_vs_recomputed_max_abs": jnp.max(jnp.abs(rollout.sampler_logp - old_logp))}
    return batch.replace(rollout=rollout.replace(old_logp=old_logp, old_mean=old_mean)), metrics

  def anchors(self, state):
    return state.reference

  def rollout_trainable(self, state):
    return state.trainable

  def trained_steps(self, config) -> int:
    """Denoising steps its update trains per image (the FLOPs of `glmrl.aot.report`): the SDE window."""
    return config.decoder.window_size

  def anchor_passes(self, config) -> int:
    """The DiT forwards its update adds per trained step beside its own: the reference's under a KL."""
    return int(float(config.decoder.beta) > 0)


POLICY = DecoderPolicy()
