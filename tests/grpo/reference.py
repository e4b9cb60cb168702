"""Independent float64 numpy implementations of the published GRPO formulas (test oracle)."""

import numpy as np


def advantages(rewards, n, scale="group", estimator="grpo", std_eps=1e-5):
  """Unbiased (ddof=1) stds; a group whose std is at most std_eps * max|r| of the group gets 0."""
  flat = np.asarray(rewards, np.float64)
  r = flat.reshape(-1, n)
  out = np.empty_like(r)
  batch_std = flat.std(ddof=1)
  for g, row in enumerate(r):
    if np.all(row == row[0]) or row.std(ddof=1) <= std_eps * np.abs(row).max():
      out[g] = 0.0
      continue
    if estimator == "grpo":
      base = np.full(n, row.mean())
    else:
      base = np.array([(row.sum() - x) / (n - 1) for x in row])
    a = row - base
    if scale == "group":
      a = a / row.std(ddof=1)
    elif scale == "batch":
      a = a / batch_std
    out[g] = a
  return out.reshape(-1)


def log_softmax_pick(logits, tokens, temperature=1.0):
  z = np.asarray(logits, np.float64) / temperature
  z = z - z.max(-1, keepdims=True)
  lse = np.log(np.exp(z).sum(-1))
  return np.take_along_axis(z, np.asarray(tokens)[..., None], -1)[..., 0] - lse


def per_token_loss(logp, old, adv, eps_lo, eps_hi, ref=None, beta=0.0, kl="k3", sampler=None, tis_cap=0.0):
  """Clipped surrogate (times the truncated IS weight min(exp(old - sampler), cap) when tis_cap > 0) + beta KL."""
  logp, old = np.asarray(logp, np.float64), np.asarray(old, np.float64)
  out = np.zeros_like(logp)
  klv = np.zeros_like(logp)
  for b in range(logp.shape[0]):
    a = float(adv[b])
    for t in range(logp.shape[1]):
      r = np.exp(logp[b, t] - old[b, t])
      w = min(np.exp(old[b, t] - float(sampler[b][t])), tis_cap) if tis_cap else 1.0
      out[b, t] = -w * min(r * a, min(max(r, 1 - eps_lo), 1 + eps_hi) * a)
      if ref is not None and beta != 0:
        d = float(ref[b, t]) - logp[b, t]
        klv[b, t] = {"k1": -d, "k2": 0.5 * d * d, "k3": np.exp(d) - d - 1}[kl]
        out[b, t] += beta * klv[b, t]
  return out, klv


def aggregate(per_token, mask, aggregation, max_tokens=None):
  """Sequences whose mask is all zero are left out of the batch altogether."""
  m = np.asarray(mask, np.float64)
  keep = m.sum(1) > 0
  per_token, m = per_token[keep], m[keep]
  B, T = per_token.shape
  if B == 0:
    return 0.0
  if aggregation == "seq_mean_token_mean":
    return float(np.mean([(per_token[b] * m[b]).sum() / m[b].sum() for b in range(B)]))
  if aggregation == "token_mean":
    return float((per_token * m).sum() / m.sum())
  return float((per_token * m).sum() / (B * (max_tokens or T)))
