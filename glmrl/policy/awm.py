"""Advantage Weighted Matching on the DiT (config.decoder.algorithm 'awm'; Xue et al. 2025, arXiv:2509.25050): its
objective and its bound policy. It samples with the trained parameters; its loss is the flow-matching loss as the
sample's log-likelihood (`glmrl.grpo.matching.awm_logprob`) in Flow-GRPO's clipped ratio, its old log-probs from
the first update of the rollout (stop_gradient of the new ones: the ratio is exactly 1 on-policy). Its rollout,
batch and accumulation are `dit_matching.py`'s.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from glmrl.grpo import flow, matching
from glmrl.policy import dit_matching


@dataclasses.dataclass(frozen=True)
class AwmObjective:
  """AWM's loss of one slot: the flow-matching loss as the sample's log-likelihood (`matching.awm_logprob`) in
  Flow-GRPO's clipped ratio with its advantage; old log-probs from the first update (ratio exactly 1 then)."""
  clip_range: float
  adv_clip_max: float
  weighting: str         # the log-likelihood's weighting (`matching.AWM_WEIGHTINGS`)
  ghuber_power: float = 0.25
  advantage_max: float = 0.0  # > 0: advantages rescaled to [-advantage_max, advantage_max] (`rescaled_advantages`)
  contrasts_average = False
  reads_reference = False  # the reference's velocity enters only through the KL
  has_ratio = True
  stats = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean")

  def slot_loss(self, v, x_t, target, sigma, mb, k, fixed, first, kl, mask, beta):
    del x_t, fixed
    logp = matching.awm_logprob(v, target, sigma, self.weighting, self.ghuber_power)
    old = jnp.where(first, jax.lax.stop_gradient(logp), mb.old_logp[:, k])
    advantages, clip = mb.advantages, self.adv_clip_max
    if self.advantage_max > 0:
      advantages, clip = matching.rescaled_advantages(advantages, clip, self.advantage_max), self.advantage_max
    numerator, denominator, aux = flow.flow_policy_loss(
        logp, old, advantages, mask, clip_range=self.clip_range, adv_clip_max=clip, kl_B=kl, beta=beta)
    aux = dict(aux, denominator=denominator)
    if kl is None:
      aux["kl_mean"] = jnp.zeros(())
    return numerator, aux, old


class AwmPolicy(dit_matching.MatchingPolicy):
  """AWM, bound to the run's config: samples with the trained parameters."""

  def __init__(self, config):
    super().__init__(config)
    d = config.decoder
    self.objective = AwmObjective(clip_range=float(d.clip_range), adv_clip_max=float(d.adv_clip_max),
                                  weighting=d.awm_weighting, ghuber_power=float(d.awm_ghuber_power),
                                  advantage_max=float(d.advantage_max))
