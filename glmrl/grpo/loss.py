"""The clipped GRPO policy loss with optional KL to a reference policy and truncated importance sampling."""

import jax
import jax.numpy as jnp

from glmrl.grpo._checks import choice, is_static, same_shape

KL_ESTIMATORS = ("k1", "k2", "k3")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
# What one importance ratio covers: each token ("token"), or each sequence, the exp of its tokens' mean log-ratio
# given to every token (GSPO, arXiv:2507.18071; TRL's importance_sampling_level="sequence").
RATIO_LEVELS = ("token", "sequence")
# How the sampler-vs-learner importance weight is bounded: per token, truncated at the cap ("token_truncate"); or
# per sequence, the exp of its summed log-ratio, masked to 0 above the cap (TRL's default "sequence_mask").
TIS_MODES = ("token_truncate", "sequence_mask")


def kl_estimate(logp, ref_logp, kl):
  """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3)."""
  log_ratio = ref_logp - logp
  if kl == "k1":
    return -log_ratio
  if kl == "k2":
    return 0.5 * jnp.square(log_ratio)
  return jnp.exp(log_ratio) - log_ratio - 1.0


def truncated_is_weights(old_logp, sampler_logp, cap):
  """Per-token min(exp(old_logp - sampler_logp), cap), without gradient (truncated importance sampling).

  old_logp are the learner's log-probs of the policy that sampled, sampler_logp the sampler's own
  (a different kernel: KV-cache decode vs teacher forcing, which disagree in low precision). The
  weight corrects the surrogate's expectation from the sampler's distribution to the learner's;
  the cap bounds its variance (verl's and TRL's rollout importance sampling).
  """
  log_w = jnp.asarray(old_logp, jnp.float32) - jnp.asarray(sampler_logp, jnp.float32)
  return jax.lax.stop_gradient(jnp.minimum(jnp.exp(log_w), jnp.asarray(cap, jnp.float32)))


def sequence_mask_weights(old_logp, sampler_logp, mask, cap):
  """[B, 1] per-sequence importance weights without gradient: rho = exp(sum_t (old_logp - sampler_logp)) over the
  sequence's tokens in `mask`, kept where rho <= cap and 0 above it (TRL's vllm_importance_sampling_mode
  "sequence_mask": the sequence's tokens leave the loss instead of being down-weighted)."""
  mask_BxN = jnp.asarray(mask, jnp.float32)
  log_w_BxN = (jnp.asarray(old_logp, jnp.float32) - jnp.asarray(sampler_logp, jnp.float32)) * mask_BxN
  rho_Bx1 = jnp.exp(jnp.sum(jnp.nan_to_num(log_w_BxN), axis=1, keepdims=True))
  return jax.lax.stop_gradient(jnp.where(rho_Bx1 <= cap, rho_Bx1, 0.0)), rho_Bx1


def policy_loss(logp, old_logp, advantages, mask, *, epsilon_low=0.2, epsilon_high=None,
                ref_logp=None, beta=0.0, kl="k3", aggregation="seq_mean_token_mean",
                max_tokens=None, sampler_logp=None, tis_cap=0.0, tis_mode="token_truncate", dual_clip=0.0,
                ratio_level="token", kl_bias_correction=False):
  """GRPO surrogate loss over [batch, tokens] log-probs; returns (loss, aux).

  Per token: -w min(r A, clip(r, 1 - epsilon_low, 1 + epsilon_high) A) with
  r = exp(logp - old_logp), plus beta * KL(pi || pi_ref) when beta != 0 and
  ref_logp is given. w = 1, or with tis_cap > 0 the importance weight of the learner's
  policy over the sampler's, bounded by `tis_mode` (`truncated_is_weights`,
  `sequence_mask_weights`); like TRL it weights the surrogate only, not the KL term.

  Options of the peers' trainers:
  - dual_clip = c > 1 (verl's clip_ratio_c): for A < 0 the surrogate is at least c A, so a token whose ratio is
    far above 1 adds at most -c A to the loss, and no gradient (verl 0.9.1 core_algos.py
    `compute_policy_loss_vanilla`; TRL's `delta` is the same bound).
  - ratio_level = "sequence": r is each sequence's exp(mean_t (logp - old_logp)) over its tokens in the mask,
    the same for all of its tokens (GSPO; TRL's importance_sampling_level="sequence"; its gradient flows through
    the mean).
  - kl_bias_correction: the KL estimate times r (TRL's use_bias_correction_kl: the estimate of KL(pi || pi_ref)
    under samples of the old policy).

  A sequence whose mask is all zero is not part of the batch under any aggregation
  (its tokens are in no numerator and it counts in no denominator): zeroing a
  group's mask drops it from every term of the loss, exactly as if it had not
  been sampled. aux["numerator"] / aux["denominator"] == loss, and both add up
  across micro-batches (pass max_tokens for seq_mean_token_sum_norm).
  """
  logp, old_logp, mask = jnp.asarray(logp), jnp.asarray(old_logp), jnp.asarray(mask)
  advantages = jnp.asarray(advantages)
  if logp.ndim != 2:
    raise ValueError(f"logp must be [batch, tokens], got shape {tuple(logp.shape)}")
  same_shape("old_logp", old_logp, "logp", logp)
  same_shape("mask", mask, "logp", logp)
  if tuple(advantages.shape) != (logp.shape[0],):
    raise ValueError(
        f"advantages has shape {tuple(advantages.shape)}; expected ({logp.shape[0]},), one per sequence")
  if ref_logp is not None:
    ref_logp = jnp.asarray(ref_logp)
    same_shape("ref_logp", ref_logp, "logp", logp)
  use_tis = not (is_static(tis_cap) and tis_cap == 0)
  if is_static(tis_cap) and not tis_cap >= 0:
    raise ValueError(f"tis_cap={tis_cap} must be >= 0 (0 turns truncated importance sampling off)")
  if use_tis:
    if sampler_logp is None:
      raise ValueError(f"tis_cap={tis_cap} needs sampler_logp (the sampler's log-probs of the tokens)")
    sampler_logp = jnp.asarray(sampler_logp)
    same_shape("sampler_logp", sampler_logp, "logp", logp)
  choice("kl", kl, KL_ESTIMATORS)
  choice("aggregation", aggregation, AGGREGATIONS)
  choice("ratio_level", ratio_level, RATIO_LEVELS)
  choice("tis_mode", tis_mode, TIS_MODES)
  use_dual = not (is_static(dual_clip) and dual_clip == 0)
  if is_static(dual_clip) and use_dual and not dual_clip > 1:
    raise ValueError(f"dual_clip={dual_clip} must be 0 (off) or > 1 (the bound c A of a negative advantage)")
  if epsilon_high is None:
    epsilon_high = epsilon_low
  for name, eps in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high)):
    if is_static(eps) and not 0.0 <= eps:
      raise ValueError(f"{name}={eps} must be >= 0")
  # epsilon_low = 1 leaves the ratio unbounded below (AWM's released clip_range = 1); more would be a negative bound.
  if is_static(epsilon_low) and not epsilon_low <= 1.0:
    raise ValueError(f"epsilon_low={epsilon_low} must be <= 1 (the ratio's lower bound 1 - epsilon_low must not be "
                     "negative)")
  if max_tokens is not None:
    if aggregation != "seq_mean_token_sum_norm":
      raise ValueError(f"max_tokens={max_tokens} only applies to aggregation='seq_mean_token_sum_norm', "
                       f"not {aggregation!r}")
    if not is_static(max_tokens) or int(max_tokens) != max_tokens or max_tokens < 1:
      raise ValueError(f"max_tokens={max_tokens!r} must be a positive integer")

  f32 = jnp.float32
  logp_BxN, old_BxN = logp.astype(f32), old_logp.astype(f32)
  mask_BxN = mask.astype(f32)
  adv_Bx1 = advantages.astype(f32)[:, None]
  length = logp_BxN.shape[1]

  log_ratio_BxN = logp_BxN - old_BxN
  if ratio_level == "sequence":
    count_Bx1 = jnp.sum(mask_BxN, axis=1, keepdims=True)
    log_ratio_BxN = jnp.broadcast_to(jnp.sum(log_ratio_BxN * mask_BxN, axis=1, keepdims=True)
                                     / jnp.maximum(count_Bx1, 1.0), log_ratio_BxN.shape)
  ratio_BxN = jnp.exp(log_ratio_BxN)
  lo, hi = 1.0 - epsilon_low, 1.0 + epsilon_high
  surrogate_BxN = jnp.minimum(ratio_BxN * adv_Bx1, jnp.clip(ratio_BxN, lo, hi) * adv_Bx1)
  if use_dual:
    bound_BxN = jnp.asarray(dual_clip, f32) * adv_Bx1
    dual_BxN = (adv_Bx1 < 0) & (surrogate_BxN < bound_BxN)
    surrogate_BxN = jnp.where(adv_Bx1 < 0, jnp.maximum(surrogate_BxN, bound_BxN), surrogate_BxN)
  if use_tis:
    if tis_mode == "sequence_mask":
      w_Bx1, rho_Bx1 = sequence_mask_weights(old_BxN, sampler_logp, mask_BxN, tis_cap)
      w_BxN, capped_BxN = jnp.broadcast_to(w_Bx1, old_BxN.shape), jnp.broadcast_to(rho_Bx1 > tis_cap, old_BxN.shape)
    else:
      w_BxN = truncated_is_weights(old_BxN, sampler_logp, tis_cap)
      capped_BxN = jnp.exp(old_BxN - sampler_logp.astype(f32)) > tis_cap
    surrogate_BxN = w_BxN * surrogate_BxN
  per_token_BxN = -surrogate_BxN

  use_kl = ref_logp is not None and not (is_static(beta) and beta == 0)
  if use_kl:
    kl_BxN = kl_estimate(logp_BxN, ref_logp.astype(f32), kl)
    if kl_bias_correction:
      kl_BxN = kl_BxN * ratio_BxN
    per_token_BxN = per_token_BxN + jnp.asarray(beta, f32) * kl_BxN

  token_sum_B = jnp.sum(per_token_BxN * mask_BxN, axis=1)
  count_B = jnp.sum(mask_BxN, axis=1)
  # Sequences in the batch: those with at least one token in the loss.
  rows = jnp.sum((count_B > 0).astype(f32))
  if aggregation == "seq_mean_token_mean":
    numerator = jnp.sum(jnp.where(count_B > 0, token_sum_B / jnp.maximum(count_B, 1.0), 0.0))
    denominator = rows
  elif aggregation == "token_mean":
    numerator = jnp.sum(token_sum_B)
    denominator = jnp.sum(count_B)
  else:
    numerator = jnp.sum(token_sum_B)
    denominator = rows * (length if max_tokens is None else int(max_tokens))
  loss = jnp.where(denominator > 0, numerator / jnp.maximum(denominator, 1e-30), 0.0)

  valid_BxN = mask_BxN > 0
  n_valid = jnp.maximum(jnp.sum(valid_BxN), 1)

  def masked_mean(x_BxN):
    return jnp.sum(jnp.where(valid_BxN, x_BxN, 0.0)) / n_valid

  any_valid = jnp.any(valid_BxN)
  aux = {
      "numerator": numerator,
      "denominator": denominator,
      "ratio_mean": masked_mean(ratio_BxN),
      "ratio_min": jnp.where(any_valid, jnp.min(jnp.where(valid_BxN, ratio_BxN, jnp.inf)), 1.0),
      "ratio_max": jnp.where(any_valid, jnp.max(jnp.where(valid_BxN, ratio_BxN, -jnp.inf)), 1.0),
      # Tokens whose clipped branch is active (their gradient is zero).
      "clip_frac_low": masked_mean(((ratio_BxN < lo) & (adv_Bx1 < 0)).astype(f32)),
      "clip_frac_high": masked_mean(((ratio_BxN > hi) & (adv_Bx1 > 0)).astype(f32)),
      "kl_mean": masked_mean(kl_BxN) if use_kl else jnp.zeros((), f32),
      "tis_weight_mean": masked_mean(w_BxN) if use_tis else jnp.ones((), f32),
      # Tokens whose importance weight the cap truncated (or, per sequence, masked).
      "tis_capped_frac": masked_mean(capped_BxN.astype(f32)) if use_tis else jnp.zeros((), f32),
  }
  if use_dual:  # Tokens the dual clip bounds (verl's pg_clipfrac_lower).
    aux["clip_frac_dual"] = masked_mean(dual_BxN.astype(f32))
  return loss, aux
