"""Direct Group Preference Optimization on the DiT (config.decoder.algorithm 'dgpo'; Luo et al. 2025, the official
code github.com/Luo-Yihong/DGPO, scripts/train_sd3_dgpo.py): its objective, its update and its bound policy.

DGPO trains on the clean latents of deterministic (ODE) rollouts, as DiffusionNFT and AWM (`dit_matching.py`), with
one group's images noised alike: the same trained steps and the same noise (DGPO's `use_shared_noise`). At each
trained step every image's flow-matching error under the policy is weighted by its advantage and by its group's
DPO weight sigmoid(S_g), S_g = beta_dpo sum_i A_i (error_i - reference error_i) / G (`matching.dgpo_group_weights`):
a group whose better samples the policy already fits better than the reference does (S_g < 0) weighs less. The
weights are taken at the update's own parameters, detached, as DGPO computes them inside its loss: where one
micro-batch holds the whole batch (decoder.micro_batch_size 0 or the batch: every group whole), from the gradient
pass's own forward and the reference's velocity beside it; else from a pass of forwards before the gradient's (the
policy's and the reference's per trained step, a group's rows spread over micro-batches), the reference's
velocities kept for the gradient's pass. The reference is the initial DiT (its adapters off under DiT LoRA);
decoder.beta adds the velocity KL to it, as DGPO's `train.beta`, reading the same reference velocities (one
reference pass per trained step, as DGPO's `ref_old_v`).

With `clip_range` (config.decoder.dgpo_clip_dsm, DGPO's `clip_dsm`; scripts/train_sd3_dgpo.py lines 1131-1143)
an image's flow error keeps no gradient at a trained step where the ratio exp(error under the moving average -
error) is past 1 + clip_range with a positive (clipped) advantage, or under 1 - clip_range with a negative one: the
moving average is DGPO's slowly updated copy `ema_ref`. The group weights are unchanged (they use the errors
detached either way).

Left out: DGPO's switch to sampling with that copy (`switch_ema_ref`) and its KL clip (`clip_kl`, off in its
released configs).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from glmrl.grpo import matching
from glmrl.models import lora as lora_lib
from glmrl.policy import accumulate
from glmrl.policy import dit
from glmrl.policy import dit_matching


@dataclasses.dataclass(frozen=True)
class DgpoObjective:
  """DGPO's loss of one slot: the group-weighted, advantage-weighted flow error."""
  beta_dpo: float
  adv_clip_max: float
  group_size: int
  clip_range: float = 0.0  # DGPO's clip_dsm against the moving average; 0: off
  # The weights from the slot's own forward and the reference's velocity (the micro-batch holds whole groups);
  # False: read from `mb.weights` (`group_weights`)
  weights_in_pass: bool = False
  has_ratio = False

  @property
  def contrasts_average(self) -> bool:
    return self.clip_range > 0

  @property
  def reads_reference(self) -> bool:
    return self.weights_in_pass

  @property
  def stats(self) -> tuple[str, ...]:
    return ("kl_mean", "group_weight_mean") + (("clip_frac",) if self.clip_range > 0 else ())

  def slot_loss(self, v, x_t, target, sigma, mb, k, fixed, first, kl, mask, beta):
    del x_t, sigma, first
    masked_mean = lambda x: jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    advantages = jnp.clip(mb.advantages, -self.adv_clip_max, self.adv_clip_max)
    error = matching.flow_error(v, target)
    if self.weights_in_pass:
      delta = error - matching.flow_error(fixed["ref"], target)  # detached by `dgpo_group_weights`
      weight = matching.dgpo_group_weights(delta[:, None], advantages, self.group_size, self.beta_dpo)[:, 0]
    else:
      weight = mb.weights[:, k]
    aux = {}
    if self.clip_range > 0:
      clipped = dgpo_clip(error, matching.flow_error(fixed["ema"], target), advantages, self.clip_range)
      error = jnp.where(clipped, jax.lax.stop_gradient(error), error)
      aux["clip_frac"] = masked_mean(clipped.astype(jnp.float32))
    numerator = jnp.sum(weight * advantages * error * mask)
    if kl is not None:
      numerator = numerator + beta * jnp.sum(kl * mask)
    aux.update({"denominator": jnp.sum(mask), "kl_mean": masked_mean(kl) if kl is not None else jnp.zeros(()),
                "group_weight_mean": masked_mean(weight)})
    return numerator, aux, None


def dgpo_clip(error_b, old_error_b, advantages_b, clip_range: float):
  """bool [b]: the images whose flow error DGPO's clip_dsm keeps from the gradient: ratio = exp(old - error) past
  1 + clip_range with a positive advantage, under 1 - clip_range with a non-positive one."""
  ratio = jnp.exp(jax.lax.stop_gradient(old_error_b - error_b))
  return jnp.where(advantages_b > 0, ratio > 1.0 + clip_range, ratio < 1.0 - clip_range)


def group_weights(graphdef, params, frozen, rollout, anchors, *, spec):
  """([B, W] the group weights at `params`, [B, W, C, h, w] the reference's velocities or None): each image's flow
  error minus the reference's at every trained slot, micro-batch by micro-batch (forwards only), then
  `matching.dgpo_group_weights`. The reference's velocities are kept where the KL reads them (decoder.beta > 0),
  as DGPO computes `ref_old_v` once for both (scripts/train_sd3_dgpo.py lines 1111-1116, 1150)."""
  ref = lora_lib.adapters_off(params) if spec.reference == "adapters_off" else anchors.reference

  def slot(carry, mb, k):
    x_t, target, _, t = dit_matching.slot_inputs(mb, k)
    velocity = lambda p: jax.lax.stop_gradient(dit_matching.velocity(graphdef, p, frozen, mb, x_t, t, spec))
    ref_v = velocity(ref)
    delta = matching.flow_error(velocity(params), target) - matching.flow_error(ref_v, target)
    return carry, (delta, ref_v if spec.beta > 0 else None)

  _, (delta_BxW, ref_v) = accumulate.scan_steps(slot, (), rollout, spec.micro_batches, rollout.timesteps.shape[1])
  o = spec.objective
  advantages = jnp.clip(rollout.advantages, -o.adv_clip_max, o.adv_clip_max)
  return matching.dgpo_group_weights(delta_BxW, advantages, o.group_size, o.beta_dpo), ref_v


def weights_in_pass(spec) -> bool:
  """Whether the update's one micro-batch holds every group whole, so the gradient's pass makes the weights."""
  return spec.micro_batches == 1


def accumulate_gradients(graphdef, params, frozen, rollout, anchors, first, *, spec):
  """`dit_matching.accumulate_gradients` of the weighted loss (the one slot scan): one micro-batch makes its group
  weights in the pass (`weights_in_pass`); several read those of `group_weights` and its reference velocities."""
  if weights_in_pass(spec):
    spec = dataclasses.replace(spec, objective=dataclasses.replace(spec.objective, weights_in_pass=True))
    return dit_matching.accumulate_gradients(graphdef, params, frozen, rollout, anchors, first, spec=spec)
  weights, reference_v = group_weights(graphdef, params, frozen, rollout, anchors, spec=spec)
  return dit_matching.accumulate_gradients(graphdef, params, frozen,
                                           rollout.replace(weights=weights, reference_v=reference_v), anchors,
                                           first, spec=spec)


class DgpoPolicy(dit_matching.MatchingPolicy):
  """DGPO, bound to the run's config: samples with the trained parameters by the ODE; a group's images share their
  trained steps and noise."""
  shares_group_noise = True
  contrasts_reference = True

  def __init__(self, config):
    super().__init__(config)
    d = config.decoder
    self.objective = DgpoObjective(beta_dpo=float(d.dgpo_beta), adv_clip_max=float(d.adv_clip_max),
                                   group_size=d.group_size,
                                   clip_range=float(d.clip_range) if d.dgpo_clip_dsm else 0.0)

  def anchor_passes(self, images: int) -> int:
    """Beside its own: the reference's (for the weights and the KL), the policy's no-gradient forward of the
    weights' pass unless the gradient's pass makes them (`weights_in_pass`), and the moving average's where it
    contrasts with it."""
    spec = self.spec(images)
    return 1 + int(not weights_in_pass(spec)) + int(spec.uses_average)

  update = staticmethod(functools.partial(dit.update, accumulate_gradients))
