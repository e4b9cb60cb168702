import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.grpo import policy_loss, truncated_is_weights
from tests.grpo import reference

AGGREGATIONS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]


def make_batch(seed=0, B=4, T=6):
  rng = np.random.default_rng(seed)
  old = rng.normal(-2.0, 0.5, size=(B, T)).astype(np.float32)
  logp = (old + rng.normal(0, 0.3, size=(B, T))).astype(np.float32)
  ref = (old + rng.normal(0, 0.2, size=(B, T))).astype(np.float32)
  adv = rng.normal(size=B).astype(np.float32)
  mask = (rng.random((B, T)) > 0.3).astype(np.float32)
  mask[1] = 0.0  # a sequence without tokens
  return logp, old, ref, adv, mask


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl,beta", [("k1", 0.1), ("k2", 0.05), ("k3", 0.2), ("k3", 0.0)])
def test_matches_reference(aggregation, kl, beta):
  logp, old, ref, adv, mask = make_batch()
  loss, aux = policy_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28, ref_logp=ref,
                          beta=beta, kl=kl, aggregation=aggregation)
  per_tok, klv = reference.per_token_loss(logp, old, adv, 0.2, 0.28, ref, beta, kl)
  want = reference.aggregate(per_tok, mask, aggregation)
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux["numerator"] / aux["denominator"], loss, rtol=1e-6)
  valid = mask > 0
  ratio = np.exp(logp.astype(np.float64) - old)[valid]
  np.testing.assert_allclose(aux["ratio_mean"], ratio.mean(), rtol=1e-5)
  np.testing.assert_allclose(aux["ratio_min"], ratio.min(), rtol=1e-5)
  np.testing.assert_allclose(aux["ratio_max"], ratio.max(), rtol=1e-5)
  np.testing.assert_allclose(aux["kl_mean"], klv[valid].mean() if beta else 0.0, rtol=1e-5, atol=1e-7)
  a = np.broadcast_to(adv[:, None], mask.shape)[valid]
  r = np.exp(logp.astype(np.float64) - old)[valid]
  np.testing.assert_allclose(aux["clip_frac_low"], np.mean((r < 0.8) & (a < 0)), atol=1e-7)
  np.testing.assert_allclose(aux["clip_frac_high"], np.mean((r > 1.28) & (a > 0)), atol=1e-7)


def test_a_clip_of_one_leaves_the_ratio_unbounded_below_as_the_reference():
  """epsilon_low = 1 (AWM's released clip range): the lower bound is 0, below every ratio, so only the upper side
  clips; value and gradient as the float64 reference with the same bounds."""
  logp, old, _, adv, mask = make_batch(seed=3)
  old = old + np.where(np.arange(old.shape[1]) % 2, 2.0, -2.0).astype(np.float32)  # ratios far from 1 both ways
  fn = lambda lp: policy_loss(lp, old, adv, mask, epsilon_low=1.0, epsilon_high=1.0, aggregation="token_mean")
  (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(logp)
  per_tok, _ = reference.per_token_loss(logp, old, adv, 1.0, 1.0, None, 0.0, "k3")
  np.testing.assert_allclose(loss, reference.aggregate(per_tok, mask, "token_mean"), rtol=1e-5, atol=1e-6)
  assert aux["clip_frac_low"] == 0.0 and aux["clip_frac_high"] > 0.0
  eps = 1e-3  # central differences of the float64 reference at every token in the loss
  for b, t in zip(*np.nonzero(mask)):
    bump = np.zeros_like(logp, np.float64)
    bump[b, t] = eps
    hi_, lo_ = (reference.aggregate(reference.per_token_loss(logp + s * bump, old, adv, 1.0, 1.0, None, 0.0, "k3")[0],
                                    mask, "token_mean") for s in (1, -1))
    np.testing.assert_allclose(grad[b, t], (hi_ - lo_) / (2 * eps), rtol=1e-3, atol=1e-6)


def test_kl_skipped_without_reference_or_beta():
  logp, old, ref, adv, mask = make_batch()
  base, _ = policy_loss(logp, old, adv, mask)
  np.testing.assert_array_equal(policy_loss(logp, old, adv, mask, ref_logp=ref, beta=0.0)[0], base)
  np.testing.assert_array_equal(policy_loss(logp, old, adv, mask, beta=0.5)[0], base)
  assert policy_loss(logp, old, adv, mask, ref_logp=ref, beta=0.5)[0] != base


def test_on_policy_ratio_is_one_and_loss_is_minus_advantage():
  logp, _, _, adv, mask = make_batch()
  loss, aux = policy_loss(logp, logp, adv, mask, aggregation="seq_mean_token_mean")
  assert aux["ratio_min"] == 1.0 and aux["ratio_max"] == 1.0
  has_tokens = mask.sum(1) > 0
  # The sequence without tokens is not in the batch: the mean runs over the other three.
  np.testing.assert_allclose(loss, -np.sum(adv * has_tokens) / has_tokens.sum(), rtol=1e-6)


@pytest.mark.parametrize("adv,log_ratio,clipped", [
    (1.5, 0.1, False),    # A > 0 inside the range
    (1.5, 0.5, True),     # A > 0 above 1 + eps_high: clipped, zero gradient
    (1.5, -0.5, False),   # A > 0 below the range: unclipped (pessimistic min)
    (-1.5, -0.1, False),  # A < 0 inside the range
    (-1.5, -0.5, True),   # A < 0 below 1 - eps_low: clipped, zero gradient
    (-1.5, 0.5, False),   # A < 0 above the range: unclipped
])
def test_gradient_in_each_clip_region(adv, log_ratio, clipped):
  old = jnp.full((1, 1), -1.0)
  logp = old + log_ratio
  grad = jax.grad(lambda lp: policy_loss(lp, old, jnp.array([adv]), jnp.ones((1, 1)),
                                         epsilon_low=0.2, epsilon_high=0.3)[0])(logp)
  # d/dlogp of -r A is -r A where the unclipped branch is active.
  want = 0.0 if clipped else -np.exp(log_ratio) * adv
  np.testing.assert_allclose(grad[0, 0], want, rtol=1e-6, atol=1e-12)
  # And against a central finite difference of the float64 reference.
  h = 1e-6
  f = lambda lr: reference.per_token_loss([[-1.0 + lr]], [[-1.0]], [adv], 0.2, 0.3)[0][0, 0]
  np.testing.assert_allclose(grad[0, 0], (f(log_ratio + h) - f(log_ratio - h)) / (2 * h), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kl", ["k1", "k2", "k3"])
def test_kl_gradient(kl):
  logp, old, ref, adv, mask = make_batch(3)
  fn = lambda lp: policy_loss(lp, jax.lax.stop_gradient(lp), adv * 0, mask, ref_logp=ref, beta=1.0, kl=kl,
                              aggregation="token_mean")[0]
  grad = np.asarray(jax.grad(fn)(jnp.asarray(logp)))
  d = ref.astype(np.float64) - logp
  per_tok = {"k1": np.ones_like(d), "k2": -d, "k3": 1 - np.exp(d)}[kl]
  np.testing.assert_allclose(grad, per_tok * mask / mask.sum(), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_accumulate_to_full_batch(aggregation):
  logp, old, ref, adv, mask = make_batch(5, B=6, T=5)
  kw = dict(ref_logp=ref, beta=0.1, aggregation=aggregation)
  if aggregation == "seq_mean_token_sum_norm":
    kw["max_tokens"] = 8
  full, _ = policy_loss(logp, old, adv, mask, **kw)
  num = den = 0.0
  for s in (slice(0, 2), slice(2, 6)):
    kws = dict(kw, ref_logp=ref[s])
    _, aux = policy_loss(logp[s], old[s], adv[s], mask[s], **kws)
    num, den = num + aux["numerator"], den + aux["denominator"]
  np.testing.assert_allclose(num / den, full, rtol=1e-6)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_jit_equals_eager(aggregation):
  logp, old, ref, adv, mask = make_batch(7)
  fn = functools.partial(policy_loss, epsilon_low=0.1, epsilon_high=0.3, beta=0.05, kl="k2", aggregation=aggregation)
  eager = fn(logp, old, adv, mask, ref_logp=ref)
  jitted = jax.jit(fn)(logp, old, adv, mask, ref_logp=ref)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), eager, jitted)


def test_bfloat16_inputs_compute_in_float32():
  logp, old, ref, adv, mask = make_batch(9)
  cast = lambda x: jnp.asarray(x, jnp.bfloat16)
  loss, aux = policy_loss(cast(logp), cast(old), cast(adv), cast(mask), ref_logp=cast(ref), beta=0.1)
  assert loss.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in aux.values())
  as64 = lambda x: np.asarray(cast(x), np.float64)
  per_tok, _ = reference.per_token_loss(as64(logp), as64(old), as64(adv), 0.2, 0.2, as64(ref), 0.1)
  np.testing.assert_allclose(loss, reference.aggregate(per_tok, mask, "seq_mean_token_mean"), rtol=1e-5)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_masked_out_sequences_are_as_if_absent(aggregation):
  """Zeroing a group's mask (drop_zero_variance_groups) removes it from every term, KL and IS weights
  included: the loss equals that of the batch without its rows."""
  logp, old, ref, adv, mask = make_batch(11, B=6, T=5)
  mask[1] = 1.0
  sampler = old + np.random.default_rng(12).normal(0, 0.3, old.shape).astype(np.float32)
  kw = dict(ref_logp=ref, beta=0.1, aggregation=aggregation, sampler_logp=sampler, tis_cap=2.0)
  dropped = mask.copy()
  dropped[2:4] = 0.0
  keep = np.array([0, 1, 4, 5])
  loss, aux = policy_loss(logp, old, adv, dropped, **kw)
  sub_kw = dict(kw, ref_logp=ref[keep], sampler_logp=sampler[keep])
  want, want_aux = policy_loss(logp[keep], old[keep], adv[keep], mask[keep], **sub_kw)
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  for k in ("ratio_mean", "kl_mean", "tis_weight_mean"):
    np.testing.assert_allclose(aux[k], want_aux[k], rtol=1e-6, err_msg=k)
  per_tok, _ = reference.per_token_loss(logp[keep], old[keep], adv[keep], 0.2, 0.2, ref[keep], 0.1, "k3",
                                        sampler[keep], 2.0)
  np.testing.assert_allclose(loss, reference.aggregate(per_tok, mask[keep], aggregation), rtol=1e-5)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("cap", [1.2, 2.0, 10.0])
def test_truncated_is_matches_reference(aggregation, cap):
  logp, old, ref, adv, mask = make_batch(13)
  # Sampler log-probs up to 0.8 nats off the learner's: weights from ~0.45 to ~2.2, some above each cap.
  sampler = old + np.random.default_rng(14).uniform(-0.8, 0.8, old.shape).astype(np.float32)
  loss, aux = policy_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28, ref_logp=ref, beta=0.05,
                          aggregation=aggregation, sampler_logp=sampler, tis_cap=cap)
  per_tok, _ = reference.per_token_loss(logp, old, adv, 0.2, 0.28, ref, 0.05, "k3", sampler, cap)
  np.testing.assert_allclose(loss, reference.aggregate(per_tok, mask, aggregation), rtol=1e-5, atol=1e-7)
  raw = np.exp(old.astype(np.float64) - sampler)[mask > 0]
  np.testing.assert_allclose(aux["tis_weight_mean"], np.minimum(raw, cap).mean(), rtol=1e-5)
  np.testing.assert_allclose(aux["tis_capped_frac"], np.mean(raw > cap), atol=1e-7)
  if cap == 1.2:
    assert 0 < aux["tis_capped_frac"] < 1
  # Off (cap 0) is the plain loss, whatever the sampler's log-probs.
  plain, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, beta=0.05, aggregation=aggregation,
                         epsilon_low=0.2, epsilon_high=0.28)
  off, off_aux = policy_loss(logp, old, adv, mask, ref_logp=ref, beta=0.05, aggregation=aggregation,
                             epsilon_low=0.2, epsilon_high=0.28, sampler_logp=sampler, tis_cap=0.0)
  assert off == plain and off_aux["tis_weight_mean"] == 1.0


@pytest.mark.parametrize("log_w,cap,weight", [(0.5, 2.0, np.exp(0.5)), (0.5, 1.2, 1.2), (-0.7, 2.0, np.exp(-0.7))])
def test_truncated_is_golden_value_and_gradient(log_w, cap, weight):
  """One token: loss -w r A with w = min(exp(old - sampler), cap); d/dlogp = -w r A, and no gradient
  flows into the sampler's log-probs (the weight is a constant)."""
  old, adv, log_ratio = -1.0, 1.5, 0.1
  fn = lambda lp, sp: policy_loss(lp, jnp.full((1, 1), old), jnp.array([adv]), jnp.ones((1, 1)),
                                  epsilon_low=0.2, epsilon_high=0.3, sampler_logp=sp, tis_cap=cap)[0]
  logp, sampler = jnp.full((1, 1), old + log_ratio), jnp.full((1, 1), old - log_w)
  np.testing.assert_allclose(fn(logp, sampler), -weight * np.exp(log_ratio) * adv, rtol=1e-6)
  g_logp, g_sampler = jax.grad(fn, argnums=(0, 1))(logp, sampler)
  np.testing.assert_allclose(g_logp[0, 0], -weight * np.exp(log_ratio) * adv, rtol=1e-6)
  assert g_sampler[0, 0] == 0.0
  h = 1e-6
  f = lambda lr: reference.per_token_loss([[old + lr]], [[old]], [adv], 0.2, 0.3, sampler=[[old - log_w]],
                                          tis_cap=cap)[0][0, 0]
  np.testing.assert_allclose(g_logp[0, 0], (f(log_ratio + h) - f(log_ratio - h)) / (2 * h), rtol=1e-4)


def test_truncated_is_weights_golden():
  w = truncated_is_weights(jnp.array([-1.0, -2.0, -0.5]), jnp.array([-1.5, -1.0, -0.5]), 2.0)
  np.testing.assert_allclose(w, [np.exp(0.5), np.exp(-1.0), 1.0], rtol=1e-6)
  np.testing.assert_allclose(truncated_is_weights(jnp.array([0.0]), jnp.array([-3.0]), 2.0), [2.0])


def test_empty_mask_gives_zero_not_nan():
  logp, old, _, adv, _ = make_batch()
  for aggregation in AGGREGATIONS:
    loss, aux = policy_loss(logp, old, adv, np.zeros_like(logp), aggregation=aggregation)
    assert loss == 0.0 and np.isfinite(aux["ratio_mean"])


def test_errors():
  logp, old, ref, adv, mask = make_batch()
  with pytest.raises(ValueError, match=r"old_logp has shape \(4, 5\) but logp has shape \(4, 6\)"):
    policy_loss(logp, old[:, :5], adv, mask)
  with pytest.raises(ValueError, match=r"mask has shape \(1, 6\)"):
    policy_loss(logp, old, adv, mask[:1])
  with pytest.raises(ValueError, match=r"advantages has shape \(4, 1\); expected \(4,\)"):
    policy_loss(logp, old, adv[:, None], mask)
  with pytest.raises(ValueError, match=r"ref_logp has shape \(6,\)"):
    policy_loss(logp, old, adv, mask, ref_logp=ref[0], beta=0.1)
  with pytest.raises(ValueError, match="kl='k4'"):
    policy_loss(logp, old, adv, mask, kl="k4")
  with pytest.raises(ValueError, match="aggregation='sum'"):
    policy_loss(logp, old, adv, mask, aggregation="sum")
  with pytest.raises(ValueError, match="epsilon_low=1.5"):
    policy_loss(logp, old, adv, mask, epsilon_low=1.5)
  with pytest.raises(ValueError, match="max_tokens=8 only applies"):
    policy_loss(logp, old, adv, mask, max_tokens=8)
  with pytest.raises(ValueError, match="max_tokens=0"):
    policy_loss(logp, old, adv, mask, aggregation="seq_mean_token_sum_norm", max_tokens=0)
  with pytest.raises(ValueError, match="tis_cap=-1.0 must be >= 0"):
    policy_loss(logp, old, adv, mask, sampler_logp=old, tis_cap=-1.0)
  with pytest.raises(ValueError, match="tis_cap=2.0 needs sampler_logp"):
    policy_loss(logp, old, adv, mask, tis_cap=2.0)
  with pytest.raises(ValueError, match=r"sampler_logp has shape \(4, 5\)"):
    policy_loss(logp, old, adv, mask, sampler_logp=old[:, :5], tis_cap=2.0)
