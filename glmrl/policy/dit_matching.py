"""What the DiT policies trained on the forward process share: DiffusionNFT (`nft.py`) and Advantage Weighted
Matching (`awm.py`). Their rollout leg, their batch and its abstract shapes, the slot's inputs and anchors' velocities,
the one accumulation over micro-batches x slots and the base of their bound policies (`MatchingPolicy`); each
algorithm gives its objective (its loss of one slot).

The rollout is the plain ODE sampler (decoder.train_steps steps at decoder.train_guidance; 1.0 is CFG-free,
one DiT pass per step); only the clean latents x0 of each image are kept, no trajectory. Each image then
trains at `decoder.train_timesteps` steps of that schedule (`draw_slots`, by `decoder.timestep_draw`: distinct
steps of the whole schedule, as DiffusionNFT trains at the sampling schedule's own timesteps shuffled per sample;
of its first steps, DGPO's; one per stratum, AWM's), drawn per image, per group, per micro-batch of each data
shard or once for the batch (`decoder.timestep_sharing`), noised with fresh eps per (image, timestep):
x_t = (1 - sigma) x0 + sigma eps with the schedule's sigma, the DiT run at the schedule's timestep, as the
sampler pairs them. eps is drawn from a per-image key folded with the timestep's slot, so every iteration
of an update sees the same x_t (AWM's old and new log-probs then compare the same points).

Both may add beta x the velocity-space KL to the reference (the initial DiT, or adapters off) and
ema_beta x the one to the moving average (AWM's anchor). The gradient is accumulated exactly over
micro-batches x timesteps (`glmrl.policy.accumulate.scan_steps`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct

from glmrl.grpo import matching
from glmrl.models import lora as lora_lib
from glmrl.policy import accumulate
from glmrl.policy import dit
from glmrl.sampling import decode, gaussian


@struct.dataclass
class MatchingRollout:
  """What the update needs of one rollout (every leaf [B, ...], sharded over the batch axes)."""
  cond: decode.Conditioning
  target_size: jax.Array   # [B, 2]
  crop: jax.Array          # [B, 2]
  x0: jax.Array            # [B, C, h, w] the clean latents the rollout decoded
  noise_keys: jax.Array    # [B] keys of each image's training noise (eps of slot k: fold_in(key, k))
  timesteps: jax.Array     # [B, W] the DiT's timestep input at each trained slot
  sigmas: jax.Array        # [B, W] the flow time sigma of each trained slot
  old_logp: jax.Array      # [B, W] AWM's old log-probs, from the first update (NaN until then; NFT: unused)
  advantages: jax.Array    # [B]
  mask: jax.Array          # [B, W] 1 in the loss, 0 for dropped groups
  weights: jax.Array | None = None  # [B, W] DGPO's group weights, made inside its update (None outside)
  # [B, W, C, h, w] the reference's velocities at the trained slots, made inside DGPO's update with its group
  # weights and read by its KL (None: the KL runs the reference itself)
  reference_v: jax.Array | None = None


@struct.dataclass
class Anchors:
  """The parameters the update holds fixed: the KL reference (None: adapters off, or no KL) and the moving
  average (NFT's old policy, AWM's anchor)."""
  reference: object
  ema: object


@dataclasses.dataclass(frozen=True)
class MatchingSpec:
  """Static description of the update (part of the compiled program's identity)."""
  objective: object      # the algorithm's loss of one slot (`nft.NftObjective`, `awm.AwmObjective`)
  guidance_scale: float
  beta: float            # velocity KL to the reference
  ema_beta: float        # velocity KL to the moving average
  micro_batches: int
  reference: str = "params"  # "params" (a copy of the initial DiT) or "adapters_off" (DiT LoRA)

  @property
  def uses_average(self) -> bool:
    """The update runs the moving average's velocity: the objective contrasts with it, or it anchors the loss."""
    return self.objective.contrasts_average or self.ema_beta > 0

  @property
  def uses_reference(self) -> bool:
    """The update runs the reference's velocity at each slot: under a KL, or where the objective reads it."""
    return self.beta > 0 or self.objective.reads_reference


def velocity(graphdef, params, frozen, mb: MatchingRollout, x_t, t_b, spec: MatchingSpec):
  """The (guided) velocity [b, C, h, w] of the DiT under `params` at x_t and per-image timesteps t_b."""
  dit = nnx.merge(graphdef, params, frozen, copy=True)
  return decode.guided_velocity(dit, mb.cond, x_t, t_b, spec.guidance_scale, mb.target_size, mb.crop)


def slot_inputs(mb: MatchingRollout, k):
  """(x_t, v*, sigma [b], timestep [b]) of trained slot k of the micro-batch."""
  eps = jax.vmap(lambda key: gaussian.normal(jax.random.fold_in(key, k), mb.x0.shape[1:], jnp.float32))(
      mb.noise_keys)
  sigma = mb.sigmas[:, k]
  return matching.noised(mb.x0, eps, sigma), matching.velocity_target(mb.x0, eps), sigma, mb.timesteps[:, k]


def _slot_loss(params, graphdef, frozen, mb, k, fixed, first, spec: MatchingSpec):
  """(numerator, (aux, AWM's old log-probs [b] or None)) of slot k; `fixed`: the anchors' velocities."""
  x_t, target, sigma, t = slot_inputs(mb, k)
  v = velocity(graphdef, params, frozen, mb, x_t, t, spec)
  mask = mb.mask[:, k]
  masked_mean = lambda x: jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  kl = None if spec.beta == 0 else matching.velocity_kl(v, fixed["ref"])
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
  """(summed float32 gradient of the numerators, statistics, AWM's old log-probs [B, W] or None)."""
  grad_fn = jax.grad(_slot_loss, has_aux=True)
  ref = lora_lib.adapters_off(params) if spec.reference == "adapters_off" else anchors.reference
  use_ema = spec.uses_average
  stats_names = mean_stats(spec)
  slots = rollout.timesteps.shape[1]

  def slot(carry, mb, k):
    x_t, _, _, t = slot_inputs(mb, k)
    fixed = {"ref": None, "ema": None}
    if spec.uses_reference:
      fixed["ref"] = jax.lax.stop_gradient(velocity(graphdef, ref, frozen, mb, x_t, t, spec)
                                           if mb.reference_v is None else mb.reference_v[:, k])
    if use_ema:
      fixed["ema"] = jax.lax.stop_gradient(velocity(graphdef, anchors.ema, frozen, mb, x_t, t, spec))
    grads, (aux, old) = grad_fn(params, graphdef, frozen, mb, k, fixed, first, spec)
    return accumulate.add(carry, grads, aux, aux["denominator"], stats_names), old

  carry0 = accumulate.init(params, stats_names, ratio=spec.objective.has_ratio)
  (grads_sum, stats), old_logp = accumulate.scan_steps(slot, carry0, rollout, spec.micro_batches, slots)
  return grads_sum, stats, old_logp


update = functools.partial(dit.update, accumulate_gradients)


TIMESTEP_DRAWS = ("uniform", "high_noise", "stratified")
TIMESTEP_SHARING = ("image", "group", "micro_batch", "batch")


@dataclasses.dataclass(frozen=True)
class SlotDraw:
  """How an update's trained steps are drawn from the rollout's s-step schedule (config.decoder.timestep_*):
  - "uniform": `slots` distinct steps of all s, uniformly;
  - "high_noise": `slots` distinct steps of the first `high_noise_steps` (the noisiest), uniformly: DGPO's draw
    (Luo-Yihong/DGPO scripts/train_sd3_dgpo.py lines 1062-1064: `random.sample(range(trunc_steps + 1), M)`);
  - "stratified": one step in each of `slots` strata of steps 1 .. int(s x `fraction`): AWM's `discrete_wo_init`
    (scxue/advantage_weighted_matching scripts/train_sd3_awm.py lines 1198-1205), step = lower + int(u x (upper -
    lower)) with the strata's bounds (`stratum_bounds`).
  Each draw is made per image, per group, per micro-batch of each data shard or once for the whole batch
  (`sharing`): DGPO draws once per inner epoch for every image (train_sd3_dgpo.py line 1064), AWM once per training
  micro-batch of each GPU (`rand_u` in its loop over one GPU's micro-batches, train_sd3_awm.py lines 1119 and
  1201), `micro_batch` here (`draw_of_row`)."""
  kind: str = "uniform"
  sharing: str = "image"
  high_noise_steps: int = 0
  fraction: float = 0.9

  def indices(self, key, steps: int, draws: int, slots: int) -> jax.Array:
    """int32 [draws, slots]: schedule step indices, one row per draw."""
    if self.kind == "stratified":
      bounds = stratum_bounds(int(steps * self.fraction), slots)
      lower, width = bounds[:-1], bounds[1:] - bounds[:-1]
      u_DxW = jax.random.uniform(key, (draws, slots))
      return (lower + (u_DxW * width).astype(jnp.int32)).astype(jnp.int32)
    candidates = self.high_noise_steps if self.kind == "high_noise" else steps
    return jnp.argsort(jax.random.uniform(key, (draws, candidates)), axis=1)[:, :slots].astype(jnp.int32)


def stratum_bounds(top: int, slots: int) -> np.ndarray:
  """int [slots + 1]: AWM's `torch.linspace(1, top, slots + 1).long()`, in exact integers: floor(1 + i (top - 1) /
  slots). Where a bound is an exact integer torch's float32 linspace can land a hair below it (its kernel computes
  from either end, by vector width), and truncating then takes the step before; the integer is the bound AWM
  means (tests/policy/test_slot_draws.py: equal to torch's wherever no bound is an exact integer)."""
  return 1 + (np.arange(slots + 1) * (top - 1)) // slots


def draw_of_row(rows: int, group: int, sharing: str, micro_batches: int = 1, shards: int = 1) -> tuple:
  """(int [rows] the draw each row takes, the number of draws) of a rollout in groups of `group` consecutive rows.
  Under "micro_batch" the draws are in AWM's order, shard by shard and within one its micro-batches in turn: the rows of data shard d (its
  contiguous block of rows / shards) in update micro-batch i (rows i, i + m, ..., `accumulate.split_micro`) take
  draw d m + i, so a draw is shared by one shard's rows of one micro-batch as AWM's by one GPU's (and the same run
  on another count of shards draws otherwise, as AWM's on another count of GPUs)."""
  r = np.arange(rows)
  if sharing == "micro_batch":
    return (r // (rows // shards)) * micro_batches + r % micro_batches, shards * micro_batches
  per_draw = {"image": 1, "group": group, "batch": rows}[sharing]
  return r // per_draw, rows // per_draw


def draw_slots(key, model_timesteps_s, sigmas_e, draws: int, slots: int, draw: SlotDraw = SlotDraw()):
  """([D, W] timesteps, [D, W] sigmas): W steps of the s-step schedule for each of `draws` draws (`SlotDraw`)."""
  steps = model_timesteps_s.shape[0]
  idx_DxW = draw.indices(key, steps, draws, slots)
  return model_timesteps_s[idx_DxW], sigmas_e[:steps][idx_DxW]


class MatchingPolicy(dit.DitPolicy):
  """A forward-process policy on the DiT, bound to the run's config: groups of one token grid's ODE samples
  (differing by their initial noise), trained at drawn timesteps of their clean latents. Subclasses give the
  objective (`objective`) and the trained state their rollouts sample with."""
  objective = None
  shares_group_noise = False  # a group's images train at the same slots with the same noise (DGPO)

  def __init__(self, config):
    super().__init__(config)
    self.loss_guidance = dit.loss_guidance(config)  # decoder.loss_guidance, unset (0) its rollouts' scale

  def spec(self, images: int) -> MatchingSpec:
    """The static description of its update on `images` rows."""
    settings = self.settings
    return MatchingSpec(
        objective=self.objective, guidance_scale=self.loss_guidance, beta=settings.beta,
        ema_beta=float(self.config.decoder.ema_beta), micro_batches=settings.micro_batches(images),
        reference=settings.reference)

  def slots(self) -> int:
    """Trained slots per image: decoder.train_timesteps, 0: every step the draw can take (the rollout's schedule,
    or its first decoder.high_noise_steps)."""
    d = self.config.decoder
    return d.train_timesteps or (d.high_noise_steps if d.timestep_draw == "high_noise" else self.train_steps)

  def slot_draw(self) -> SlotDraw:
    """decoder.timestep_*; a policy whose groups share their noise draws per group at least."""
    d = self.config.decoder
    sharing = "group" if self.shares_group_noise and d.timestep_sharing == "image" else d.timestep_sharing
    return SlotDraw(kind=d.timestep_draw, sharing=sharing, high_noise_steps=d.high_noise_steps,
                    fraction=float(d.stratified_fraction))

  def trained_slots(self, key, model_timesteps_s, sigmas_e, rows: int, group: int, shards: int = 1) -> tuple:
    """([rows, W] timesteps, [rows, W] sigmas) of a rollout of `rows` images in groups of `group` consecutive rows,
    its batch split over `shards` data shards: one draw per image, per group, per micro-batch of each shard or for
    all rows (`slot_draw`, `draw_of_row`)."""
    draw = self.slot_draw()
    row_draw, draws = draw_of_row(rows, group, draw.sharing, self.settings.micro_batches(rows), shards)
    timesteps, sigmas = draw_slots(key, model_timesteps_s, sigmas_e, draws, self.slots(), draw)
    return timesteps[row_draw], sigmas[row_draw]

  def rollout_leg(self, run, prepared, sample, key, dit_params, step: int, on_images=None) -> tuple:
    """(images, MatchingRollout, metrics): every grid decoded by the ODE, the clean latents kept with each image's
    trained slots and training-noise keys (advantages, mask and old log-probs still empty)."""
    del step
    pipeline = run.pipeline
    noise_key, slot_key, train_key = jax.random.split(key, 3)
    target_B, latents, _, cond = self.leg_inputs(run, prepared, sample, noise_key)
    images, x0 = self.decode(run, prepared, target_B, latents, cond, dit_params, on_images=on_images)
    b = x0.shape[0]
    g = run.request.samples_per_grid if self.shares_group_noise else 1
    timesteps, sigmas = self.trained_slots(slot_key, *pipeline.schedule(self.train_steps), b,
                                           run.request.samples_per_grid, pipeline.batch_devices)
    keys = jax.random.split(train_key, b // g)
    per_row = lambda x: pipeline.shard_batch(jnp.repeat(x, g, axis=0) if g > 1 else x)
    rollout = MatchingRollout(
        **self.rows(pipeline, cond), x0=pipeline.shard_batch(x0), noise_keys=per_row(keys),
        timesteps=pipeline.shard_batch(timesteps), sigmas=pipeline.shard_batch(sigmas), old_logp=None,
        advantages=None, mask=None)
    return images, rollout, {}

  def rollout_batch(self, sampled, advantages, keep) -> MatchingRollout:
    rollout = sampled.legs[self.name]
    return rollout.replace(old_logp=jnp.full(rollout.timesteps.shape, jnp.nan, jnp.float32), advantages=advantages,
                           mask=jnp.broadcast_to(keep[:, None], rollout.timesteps.shape))

  def abstract_inputs(self, run) -> tuple:
    """(update shape, MatchingRollout) of its update, abstract: every image's clean latents and trained slots."""
    b = run.images
    per_slot = run.batch_array((b, self.slots()), jnp.float32)
    return (b,), MatchingRollout(
        **self.abstract_rows(run, b), x0=run.batch_array((b, *run.latent_shape), jnp.float32),
        noise_keys=run.batch_keys(b), timesteps=per_slot, sigmas=per_slot, old_logp=per_slot,
        advantages=run.batch_array((b,), jnp.float32), mask=per_slot)

  def update_shape(self, sampled) -> tuple:
    return (sampled.legs[self.name].x0.shape[0],)

  def after_first(self, batch: MatchingRollout, outputs) -> tuple[MatchingRollout, dict]:
    if outputs is None:  # nothing of the first update is reused (DiffusionNFT)
      return batch, {}
    return batch.replace(old_logp=outputs), {}

  def anchors(self, state) -> Anchors:
    return Anchors(state.reference, state.ema)

  def trained_steps(self) -> int:
    return self.slots()

  def anchor_passes(self, images: int) -> int:
    """The DiT forwards its update on `images` rows adds per trained step beside its own: the reference's under a
    KL, the moving average's when the objective contrasts with it or an anchor weighs it."""
    spec = self.spec(images)
    return int(spec.uses_reference) + int(spec.uses_average)

  update = staticmethod(update)
