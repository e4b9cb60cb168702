"""DiffusionNFT on the DiT (config.decoder.algorithm 'nft'; Zheng et al. 2025, arXiv:2509.16117): its objective
and its bound policy. It samples its rollouts with its old policy, the moving average (`glmrl.policy.ema`,
DiffusionNFT's "old" adapter), and contrasts the trained velocity with the average's at the same x_t
(`glmrl.grpo.matching.nft_loss`). Its rollout, batch and accumulation are `dit_matching.py`'s.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from glmrl.grpo import matching
from glmrl.policy import dit_matching


@dataclasses.dataclass(frozen=True)
class NftObjective:
  """DiffusionNFT's loss of one slot: the trained velocity against the moving average's (its old policy) at the
  same x_t, weighted by the advantage as an optimality probability (`matching.nft_loss`)."""
  nft_beta: float
  adv_clip_max: float
  contrasts_average = True  # its loss needs the moving average's velocity
  reads_reference = False  # the reference's velocity enters only through the KL
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


class NftPolicy(dit_matching.MatchingPolicy):
  """DiffusionNFT, bound to the run's config: samples with the moving average and contrasts with it."""

  def __init__(self, config):
    super().__init__(config)
    d = config.decoder
    self.objective = NftObjective(nft_beta=float(d.nft_beta), adv_clip_max=float(d.adv_clip_max))

  def rollout_trainable(self, state):
    return state.ema_params()
