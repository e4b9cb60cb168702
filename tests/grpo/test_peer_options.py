"""The generator's options users port configs with, value and gradient against the peers' formulas re-written in
float64 (`tests/grpo/peers.py`: verl 0.9.1's dual clip; TRL 1.16.0's sequence-level ratio (GSPO), bias-corrected
KL and sequence_mask importance weights). Gradients: central differences of the float64 formula, rtol 1e-3."""

import jax
import numpy as np
import pytest

from glmrl.grpo import policy_loss
from tests.grpo import peers


def batch(seed=0, B=4, T=6, spread=0.3):
  rng = np.random.default_rng(seed)
  old = rng.normal(-2.0, 0.5, size=(B, T)).astype(np.float32)
  logp = (old + rng.normal(0, spread, size=(B, T))).astype(np.float32)
  ref = (old + rng.normal(0, 0.2, size=(B, T))).astype(np.float32)
  adv = np.array([1.3, -0.7, -2.0, 0.4], np.float32)[:B]
  mask = (rng.random((B, T)) > 0.25).astype(np.float32)
  mask[:, 0] = 1.0
  return logp, old, ref, adv, mask


def check(logp, mask, ours, theirs, rtol=1e-5):
  """Value and gradient in logp of `ours(logp)` (glmrl) against `theirs(logp)` (the float64 formula)."""
  (loss, aux), grad = jax.value_and_grad(ours, has_aux=True)(logp)
  np.testing.assert_allclose(float(loss), theirs(logp.astype(np.float64)), rtol=rtol, atol=1e-6)
  h = 1e-4
  for b, t in zip(*np.nonzero(mask)):
    bump = np.zeros(logp.shape)
    bump[b, t] = h
    fd = (theirs(logp + bump) - theirs(logp - bump)) / (2 * h)
    np.testing.assert_allclose(float(grad[b, t]), fd, rtol=1e-3, atol=1e-6)
  return aux


def test_dual_clip_matches_verl():
  """Ratios far above 1 on negative advantages: the bound -c A holds, with zero gradient, where verl's does."""
  logp, old, _, adv, mask = batch(seed=1, spread=1.2)
  kw = dict(eps_lo=0.2, eps_hi=0.28)
  aux = check(logp, mask, lambda lp: policy_loss(lp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28,
                                                 dual_clip=3.0),
              lambda lp: peers.seq_mean_token_mean(peers.per_token_loss(lp, old, adv, mask, clip_ratio_c=3.0, **kw),
                                                   mask))
  ratio, neg = np.exp(logp.astype(np.float64) - old), np.broadcast_to(adv[:, None] < 0, mask.shape)
  bounded = neg & (ratio > 3.0) & (mask > 0)
  assert bounded.any()  # the batch reaches the bound (the check above can fail)
  np.testing.assert_allclose(float(aux["clip_frac_dual"]), bounded.sum() / mask.sum(), rtol=1e-6)
  plain = policy_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28)[0]
  assert float(plain) > float(policy_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28,
                                          dual_clip=3.0)[0])


@pytest.mark.parametrize("eps_lo,eps_hi", [(3e-4, 4e-4), (0.2, 0.28)])
def test_sequence_level_ratio_matches_trl_and_gspo(eps_lo, eps_hi):
  """GSPO's clip ranges (3e-4 / 4e-4, its section 5.1) and the token defaults: every token of a sequence shares
  exp(mean log-ratio), and the gradient flows through the mean."""
  logp, old, _, adv, mask = batch(seed=2, spread=1e-3 if eps_lo < 1e-3 else 0.3)
  aux = check(logp, mask, lambda lp: policy_loss(lp, old, adv, mask, epsilon_low=eps_lo, epsilon_high=eps_hi,
                                                 ratio_level="sequence"),
              lambda lp: peers.seq_mean_token_mean(peers.per_token_loss(lp, old, adv, mask, eps_lo=eps_lo,
                                                                        eps_hi=eps_hi, level="sequence"), mask))
  seq = np.exp(((logp.astype(np.float64) - old) * mask).sum(1) / mask.sum(1))
  np.testing.assert_allclose([float(aux["ratio_min"]), float(aux["ratio_max"])], [seq.min(), seq.max()], rtol=1e-5)


def test_bias_corrected_kl_matches_trl():
  logp, old, ref, adv, mask = batch(seed=3)
  check(logp, mask, lambda lp: policy_loss(lp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28, ref_logp=ref,
                                           beta=0.3, kl="k3", kl_bias_correction=True),
        lambda lp: peers.seq_mean_token_mean(peers.per_token_loss(lp, old, adv, mask, eps_lo=0.2, eps_hi=0.28,
                                                                  ref=ref, beta=0.3, bias_correction=True), mask))
  # On-policy the correction's value is 1: the same loss as without it.
  on = lambda corrected: float(policy_loss(old, old, adv, mask, ref_logp=ref, beta=0.3,
                                           kl_bias_correction=corrected)[0])
  np.testing.assert_allclose(on(True), on(False), rtol=1e-6)


def test_sequence_mask_weights_match_trl():
  """The sampler's log-probs off by a per-sequence drift: sequences whose exp(summed drift) passes the cap leave
  the surrogate (weight 0), the others are weighted by it."""
  logp, old, _, adv, mask = batch(seed=4)
  drift = np.array([0.02, -0.05, 0.5, 0.0], np.float32)[:, None] / mask.sum(1, keepdims=True)
  sampler = old - drift
  aux = check(logp, mask, lambda lp: policy_loss(lp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28,
                                                 sampler_logp=sampler, tis_cap=1.5, tis_mode="sequence_mask"),
              lambda lp: peers.seq_mean_token_mean(peers.per_token_loss(lp, old, adv, mask, eps_lo=0.2, eps_hi=0.28,
                                                                        sampler=sampler, sequence_mask_cap=1.5),
                                                   mask))
  masked = np.broadcast_to((np.exp(drift[:, 0] * mask.sum(1)) > 1.5)[:, None], mask.shape)[mask > 0]
  assert masked.any() and not masked.all()
  np.testing.assert_allclose(float(aux["tis_capped_frac"]), masked.mean(), rtol=1e-6)


@pytest.mark.parametrize("kw,match", [
    (dict(dual_clip=1.0), "dual_clip=1.0 must be 0"), (dict(ratio_level="seq"), "ratio_level"),
    (dict(tis_mode="mask", tis_cap=2.0), "tis_mode")])
def test_bad_options_name_the_value(kw, match):
  logp, old, _, adv, mask = batch()
  with pytest.raises(ValueError, match=match):
    policy_loss(logp, old, adv, mask, sampler_logp=old, **kw)
