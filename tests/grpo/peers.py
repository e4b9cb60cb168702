"""The peers' GRPO options, float64, written from their own lines (test oracle; no glmrl code):

- verl 0.9.1, verl/trainer/ppo/core_algos.py lines 1349-1363 (`compute_policy_loss_vanilla`): the dual clip.
- TRL 1.16.0, trl/trainer/grpo_trainer.py lines 3083-3095 (`importance_sampling_level`), 3097-3105
  (`use_bias_correction_kl`) and 2634-2707 (`vllm_importance_sampling_mode="sequence_mask"`).
Per token over [B, T] arrays; `seq_mean_token_mean` aggregation (TRL's loss_type "grpo", GSPO's objective).
"""

import numpy as np


def per_token_loss(logp, old, adv, mask, *, eps_lo, eps_hi, clip_ratio_c=None, level="token", ref=None,
                   beta=0.0, bias_correction=False, sampler=None, sequence_mask_cap=None):
  logp, old, mask = (np.asarray(a, np.float64) for a in (logp, old, mask))
  adv = np.asarray(adv, np.float64)[:, None]
  log_ratio = logp - old
  if level == "sequence":  # TRL: (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1), one per sequence
    log_ratio = np.broadcast_to((log_ratio * mask).sum(-1, keepdims=True) / np.maximum(mask.sum(-1, keepdims=True),
                                                                                        1.0), logp.shape)
  ratio = np.exp(log_ratio)
  pg1 = -adv * ratio
  pg2 = -adv * np.clip(ratio, 1 - eps_lo, 1 + eps_hi)
  loss = np.maximum(pg1, pg2)
  if clip_ratio_c is not None:  # verl: pg_losses3 = -A * c; min(pg_losses3, clip_pg_losses1) where A < 0
    loss = np.where(adv < 0, np.minimum(-adv * clip_ratio_c, loss), loss)
  if sequence_mask_cap is not None:  # TRL: exp of the summed (old - sampler) log-ratio, 0 above the cap
    rho = np.exp(((old - np.asarray(sampler, np.float64)) * mask).sum(-1, keepdims=True))
    loss = loss * np.where(rho > sequence_mask_cap, 0.0, rho)
  if ref is not None and beta:
    d = np.asarray(ref, np.float64) - logp
    k3 = np.exp(d) - d - 1
    if bias_correction:  # TRL: per_token_kl = per_token_kl * coef_1
      k3 = k3 * ratio
    loss = loss + beta * k3
  return loss


def seq_mean_token_mean(per_token, mask):
  mask = np.asarray(mask, np.float64)
  keep = mask.sum(1) > 0
  return float(np.mean((per_token * mask).sum(1)[keep] / mask.sum(1)[keep]))
