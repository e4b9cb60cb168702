"""The decoder (DiT) policy trained on the forward process: DiffusionNFT ('nft') and Advantage Weighted Matching
('awm'), config.decoder.algorithm. Their rollout batch, their update and the `Policy` objects (`NFT`, `AWM`).

The rollout is the plain ODE sampler (decoder.train_steps steps at decoder.train_guidance; 1.0 is CFG-free,
one DiT pass per step); only the clean latents x0 of each image are kept, no trajectory. Each image then
trains at `decoder.train_timesteps` steps of that schedule drawn without replacement (DiffusionNFT trains at
the sampling schedule's own timesteps, shuffled per sample), noised with fresh eps per (image, timestep):
x_t = (1 - sigma) x0 + sigma eps with the schedule's sigma, the DiT run at the schedule's timestep, as the
sampler pairs them. eps is drawn from a per-image key folded with the timestep's slot, so every iteration
of an update sees the same x_t (AWM's old and new log-probs then compare the same points).

- NFT samples its rollouts with the moving average (`glmrl.policy.ema`, DiffusionNFT's "old" adapter) and
  contrasts the trained velocity with the average's at the same x_t (`glmrl.grpo.matching.nft_loss`).
- AWM samples with the trained parameters; its old log-probs come from the first update of the rollout
  (stop_gradient of the new ones: the ratio is exactly 1 on-policy), as Flow-GRPO's.
Both may add beta x the velocity-space KL to the reference (the initial DiT, or adapters off) and
ema_beta x the one to the moving average (AWM's anchor). The gradient is accumulated exactly over
micro-batches x timesteps (`glmrl.policy.accumulate`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from flax import struct

from glmrl.grpo import flow, matching
from glmrl.models import lora as lora_lib
from glmrl.policy import accumulate
from glmrl.policy import decoder as decoder_lib
from glmrl.policy.base import Request
from glmrl.sampling import decode


@struct.dataclass
class MatchingRollout:
  """What the update needs of one rollout (every leaf [B, ...], sharded over the batch axes)."""
  cond: decode.Conditioning
  target_size: jax.Array   # [B, 2]
  crop: jax.Array          # [B, 2]
  x0: jax.Array            # [B, C, h, w] the clean latents the rollout decoded
  noise_keys: jax.Array    # [B] keys of each image's training noise (eps of slot k: fold_in(key, k))
  timesteps: jax.Array     # [B, K] the DiT's timestep input at each trained slot
  sigmas: jax.Array        # [B, K] the flow time sigma of each trained slot
  old_logp: jax.Array      # [B, K] AWM's old log-probs, from the first update (NaN until then; NFT: unused)
  advantages: jax.Array    # [B]
  mask: jax.Array          # [B, K] 1 in the loss, 0 for dropped groups


@struct.dataclass
class Anchors:
  """The parameters the update holds fixed: the KL reference (None: adapters off, or no KL) and the moving
  average (NFT's old policy, AWM's anchor)."""
  reference: object
  ema: object


@dataclasses.dataclass(frozen=True)
class NftObjective:
  """DiffusionNFT's loss of one slot: the trained velocity against the moving average's (its old policy) at the
  same x_t, weighted by the advantage as an optimality probability (`matching.nft_loss`)."""
  nft_beta: float
  adv_clip_max: float
  contrasts_average = True  # its loss needs the moving average's velocity
  has_ratio = False
  stats = ("kl_mean", "old_deviation")

  def slot_loss(self, v, x_t, target, sigma, mb, k, fixed, first, kl, mask, beta):
    """(numerator, aux, old log-probs [b] or None) of slot k."""
    del target, k, first
    masked_mean = lambda x: jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    r = matching.optimality(mb.advantages, self.adv_clip_max)
    loss = matching.nft_loss(v, fixed["ema"], mb.x0, x_t, sigma, r, beta=self.nft_beta, scale=self.adv_clip_max)
    numerator = jnp.sum(loss * mask)
    if kl is not None:
      numerator = numerator + beta * jnp.sum(kl * mask)
    aux = {"denominator": jnp.sum(mask), "kl_mean": masked_mean(kl) if kl is not None else jnp.zeros(()),
           "old_deviation": masked_mean(jax.lax.stop_gradient(matching.velocity_kl(v, fixed["ema"])))}
    return numerator, aux, None


@dataclasses.dataclass(frozen=True)
class AwmObjective:
  """AWM's loss of one slot: the flow-matching loss as the sample's log-likelihood (`matching.awm_logprob`) in
  Flow-GRPO's clipped ratio with its advantage; old log-probs from the first update (ratio exactly 1 then)."""
  clip_range: float
  adv_clip_max: float
  weighting: str         # the log-likelihood's weighting (`matching.AWM_WEIGHTINGS`)
  contrasts_average = False
  has_ratio = True
  stats = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean")

  def slot_loss(self, v, x_t, target, sigma, mb, k, fixed, first, kl, mask, beta):
    del x_t, fixed
    logp = matching.awm_logprob(v, target, sigma, self.weighting)
    old = jnp.where(first, jax.lax.stop_gradient(logp), mb.old_logp[:, k])
    numerator, denominator, aux = flow.flow_policy_loss(
        logp, old, mb.advantages, mask, clip_range=self.clip_range, adv_clip_max=self.adv_clip_max, kl_B=kl,
        beta=beta)
    aux = dict(aux, denominator=denominator)
    if kl is None:
      aux["kl_mean"] = jnp.zeros(())
    return numerator, aux, old


@dataclasses.dataclass(frozen=True)
class MatchingSpec:
  """Static description of the update (part of the compiled program's identity)."""
  objective: NftObjective | AwmObjective
  guidance_scale: float
  beta: float            # velocity KL to the reference
  ema_beta: float        # velocity KL to the moving average
  micro_batches: int
  reference: str = "params"  # "params" (a copy of the initial DiT) or "adapters_off" (DiT LoRA)

  @property
  def uses_average(self) -> bool:
    """The update runs the moving average's velocity: the objective contrasts with it, or it anchors the loss."""
    return self.objective.contrasts_average or self.ema_beta > 0


def velocity(graphdef, params, frozen, mb: MatchingRollout, x_t, t_b, spec: MatchingSpec):
  """The (guided) velocity [b, C, h, w] of the DiT under `params` at x_t and per-image timesteps t_b."""
  dit = nnx.merge(graphdef, params, frozen, copy=True)
  return decode.guided_velocity(dit, mb.cond, x_t, t_b, spec.guidance_scale, mb.target_size, mb.crop)


def slot_inputs(mb: MatchingRollout, k):
  """(x_t, v*, sigma [b], timestep [b]) of trained slot k of the micro-batch."""
  eps = jax.vmap(lambda key: jax.random.normal(jax.random.fold_in(key, k), mb.x0.shape[1:], jnp.float32))(
      mb.noise_keys)
  sigma = mb.sigmas[:, k]
  return matching.noised(mb.x0, eps, sigma), matching.velocity_target(mb.x0, eps), sigma, mb.timesteps[:, k]


def _slot_loss(params, graphdef, frozen, mb, k, fixed, first, spec: MatchingSpec):
  """(numerator, (aux, AWM's old log-probs [b] or None)) of slot k; `fixed`: the anchors' velocities."""
  x_t, target, sigma, t = slot_inputs(mb, k)
  v = velocity(graphdef, params, frozen, mb, x_t, t, spec)
  mask = mb.mask[:, k]
  masked_mean = lambda x: jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  kl = None if fixed["ref"] is None else matching.velocity_kl(v, fixed["ref"])
  numerator, aux, old = spec.objective.slot_loss(v, x_t, target, sigma, mb, k, fixed, first, kl, mask, spec.beta)
  if spec.ema_beta > 0:
    ema_kl = matching.velocity_kl(v, fixed["ema"])
    numerator = numerator + spec.ema_beta * jnp.sum(ema_kl * mask)
    aux["ema_kl_mean"] = masked_mean(ema_kl)
  return numerator, (dict(aux, numerator=numerator), old)


def mean_stats(spec: MatchingSpec) -> tuple[str, ...]:
  return spec.objective.stats + (("ema_kl_mean",) if spec.ema_beta > 0 else ())


def accumulate_gradients(graphdef, params, frozen, rollout: MatchingRollout, anchors: Anchors, first, *,
                         spec: MatchingSpec):
  """(summed float32 gradient of the numerators, statistics, AWM's old log-probs [B, K] or None)."""
  grad_fn = jax.grad(_slot_loss, has_aux=True)
  ref = lora_lib.adapters_off(params) if spec.reference == "adapters_off" else anchors.reference
  use_ema = spec.uses_average
  stats_names = mean_stats(spec)
  slots = rollout.timesteps.shape[1]

  def slot(carry, k, mb):
    x_t, _, _, t = slot_inputs(mb, k)
    fixed = {"ref": None, "ema": None}
    if spec.beta > 0:
      fixed["ref"] = jax.lax.stop_gradient(velocity(graphdef, ref, frozen, mb, x_t, t, spec))
    if use_ema:
      fixed["ema"] = jax.lax.stop_gradient(velocity(graphdef, anchors.ema, frozen, mb, x_t, t, spec))
    grads, (aux, old) = grad_fn(params, graphdef, frozen, mb, k, fixed, first, spec)
    return accumulate.add(carry, grads, aux, aux["denominator"], stats_names), old

  def micro_batch(carry, mb):
    carry, old_KxB = jax.lax.scan(lambda c, k: slot(c, k, mb), carry, jnp.arange(slots))
    return carry, None if old_KxB is None else old_KxB.T

  carry0 = accumulate.init(params, stats_names, ratio=spec.objective.has_ratio)
  (grads_sum, stats), old_MxBxK = jax.lax.scan(micro_batch, carry0,
                                               accumulate.split_micro(rollout, spec.micro_batches))
  return grads_sum, stats, accumulate.merge_micro(old_MxBxK)


def update(graphdef, params, frozen, opt_state, rollout: MatchingRollout, anchors: Anchors, first=True, *,
           spec: MatchingSpec, tx, schedule):
  """One optimizer step on the rollout's trained slots; returns (params, opt_state, metrics, old_logp or
  None). A non-finite loss or gradient leaves params and optimizer state untouched (`skipped = 1`)."""
  grads_sum, stats, old_logp = accumulate_gradients(graphdef, params, frozen, rollout, anchors, first, spec=spec)
  new_params, new_opt_state, metrics = accumulate.apply(tx, schedule, params, opt_state, grads_sum, stats,
                                                        jnp.maximum(stats["denominator"], 1.0))
  return new_params, new_opt_state, metrics, old_logp


def train_timesteps(config) -> int:
  """Trained slots per image: decoder.train_timesteps, 0: every step of the rollout's schedule."""
  return config.decoder.train_timesteps or config.decoder.train_steps


def draw_slots(key, model_timesteps_S, sigmas_S1, images: int, slots: int):
  """([B, K] timesteps, [B, K] sigmas): K distinct steps of the S-step schedule per image, uniformly."""
  steps = model_timesteps_S.shape[0]
  idx_BxK = jnp.argsort(jax.random.uniform(key, (images, steps)), axis=1)[:, :slots]
  return model_timesteps_S[idx_BxK], sigmas_S1[:steps][idx_BxK]


def matching_spec(config, objective, images: int) -> MatchingSpec:
  d, settings = config.decoder, decoder_lib.POLICY.settings(config)
  return MatchingSpec(
      objective=objective, guidance_scale=decoder_lib.train_guidance(config), beta=settings.beta,
      ema_beta=float(d.ema_beta), micro_batches=decoder_lib.micro_batches(config, images),
      reference="adapters_off" if settings.lora.enabled else "params")


class MatchingPolicy(decoder_lib.DecoderPolicy):
  """A forward-process policy on the DiT: groups of one token grid's ODE samples (differing by their initial noise),
  trained at drawn timesteps of their clean latents. Subclasses give the objective."""

  def objective(self, config):
    raise NotImplementedError

  def request(self, config) -> Request:
    return Request(samples_per_grid=config.decoder.group_size, clean=True)

  def rollout_batch(self, config, sampled, advantages, keep) -> MatchingRollout:
    rollout = sampled.clean
    return rollout.replace(old_logp=jnp.full(rollout.timesteps.shape, jnp.nan, jnp.float32), advantages=advantages,
                           mask=jnp.broadcast_to(keep[:, None], rollout.timesteps.shape))

  def update_shape(self, sampled) -> tuple:
    return (sampled.clean.x0.shape[0],)

  def make_update(self, state, config, shape):
    images, = shape
    return state.jit_update(update, matching_spec(config, self.objective(config), images))

  def after_first(self, batch: MatchingRollout, outputs, config) -> tuple[MatchingRollout, dict]:
    del config
    if outputs is None:  # NFT: nothing of the first update is reused
      return batch, {}
    return batch.replace(old_logp=outputs), {}

  def anchors(self, state) -> Anchors:
    return Anchors(state.reference, state.ema)

  def trained_steps(self, config) -> int:
    return train_timesteps(config)

  def anchor_passes(self, config) -> int:
    """The DiT forwards its update adds per trained step beside its own: the reference's under a KL, the moving
    average's when the objective contrasts with it or an anchor weighs it."""
    d = config.decoder
    return int(float(d.beta) > 0) + int(self.objective(config).contrasts_average or float(d.ema_beta) > 0)


class NftPolicy(MatchingPolicy):
  """DiffusionNFT: samples with its old policy, the moving average, and contrasts with it."""

  def objective(self, config) -> NftObjective:
    return NftObjective(nft_beta=float(config.decoder.nft_beta), adv_clip_max=float(config.decoder.adv_clip_max))

  def rollout_trainable(self, state):
    return state.ema_params()


class AwmPolicy(MatchingPolicy):
  """AWM: samples with the trained parameters."""

  def objective(self, config) -> AwmObjective:
    d = config.decoder
    return AwmObjective(clip_range=float(d.clip_range), adv_clip_max=float(d.adv_clip_max),
                        weighting=d.awm_weighting)


NFT = NftPolicy()
AWM = AwmPolicy()
