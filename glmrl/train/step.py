"""The GRPO policy update: one jitted function, micro-batched with exact loss accumulation.

The log-probs come from `glmrl.sampling.logprobs.token_logprobs`, the same function (same
positions, temperature and token filtering) that records the old log-probs, so the
importance ratio of the first iteration is exactly 1.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from flax import struct

from glmrl import grpo
from glmrl.models.ar.prompt import GenerationLayout
from glmrl.sampling.logprobs import SamplingConfig, token_logprobs


@struct.dataclass
class Rollout:
  """What the update needs of one rollout batch (all [B, ...], sharded over the batch axes)."""
  sequence_ids: jax.Array  # [B, S] prompt + generated tokens
  positions: jax.Array     # [3, B, S]
  valid: jax.Array         # [B, S] False on left padding
  old_logp: jax.Array      # [B, N] log-probs of the generated tokens when sampled (same function)
  advantages: jax.Array    # [B]
  mask: jax.Array          # [B, N] 1 for tokens in the loss, 0 for dropped groups
  ref_logp: jax.Array | None = None  # [B, N] under the frozen initial policy (only when beta > 0)


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
  """Static description of the update (hashable: part of the compiled program's identity)."""
  prompt_len: int
  layout: GenerationLayout
  sampling: SamplingConfig
  micro_batches: int
  epsilon_low: float
  epsilon_high: float
  beta: float
  kl: str
  aggregation: str
  logprob_chunk: int = 256
  remat: bool = False


def rollout_logprobs(graphdef, params, frozen, rollout: Rollout, spec: UpdateSpec) -> jax.Array:
  """Log-probs [B, N] of the rollout's generated tokens under `params` (the one log-prob function)."""
  model = nnx.merge(graphdef, params, frozen)
  return token_logprobs(model, rollout.sequence_ids, rollout.positions, rollout.valid, prompt_len=spec.prompt_len,
                        layout=spec.layout, cfg=spec.sampling, chunk_size=spec.logprob_chunk, remat=spec.remat)


def _micro_loss(params, graphdef, frozen, mb: Rollout, spec: UpdateSpec):
  logp = rollout_logprobs(graphdef, params, frozen, mb, spec)
  max_tokens = mb.old_logp.shape[1] if spec.aggregation == "seq_mean_token_sum_norm" else None
  _, aux = grpo.policy_loss(
      logp, mb.old_logp, mb.advantages, mb.mask, epsilon_low=spec.epsilon_low, epsilon_high=spec.epsilon_high,
      ref_logp=mb.ref_logp, beta=spec.beta, kl=spec.kl, aggregation=spec.aggregation, max_tokens=max_tokens)
  return aux["numerator"], aux


def _split_micro(tree, m: int):
  """[B, ...] -> [m, B/m, ...] (positions [3, B, S] -> [m, 3, B/m, S])."""
  def one(path, x):
    if x is None:
      return None
    if path and getattr(path[-1], "name", None) == "positions":
      return jnp.moveaxis(x.reshape(3, m, -1, x.shape[-1]), 1, 0)
    return x.reshape(m, -1, *x.shape[1:])
  return jax.tree_util.tree_map_with_path(one, tree)


def update(graphdef, params, frozen, opt_state, rollout: Rollout, *, spec: UpdateSpec,
           tx: optax.GradientTransformation, schedule):
  """One optimizer step on the rollout; returns (params, opt_state, metrics).

  The gradient of loss = sum(numerator) / sum(denominator) is accumulated over micro-batches
  as sum(grad numerator) / sum(denominator), which equals the full-batch gradient exactly
  (the denominators do not depend on the parameters). A non-finite loss or gradient
  leaves params and optimizer state untouched and reports `skipped = 1`.
  """
  grad_fn = jax.grad(_micro_loss, has_aux=True)
  micro = _split_micro(rollout, spec.micro_batches)
  n_tokens = jnp.sum(rollout.mask > 0)

  def body(carry, mb):
    grads_acc, stats = carry
    grads, aux = grad_fn(params, graphdef, frozen, mb, spec)
    tokens = jnp.sum(mb.mask > 0).astype(jnp.float32)
    stats = {
        "numerator": stats["numerator"] + aux["numerator"],
        "denominator": stats["denominator"] + aux["denominator"],
        # Token-weighted sums of the per-micro-batch token means.
        "ratio_mean": stats["ratio_mean"] + aux["ratio_mean"] * tokens,
        "clip_frac_low": stats["clip_frac_low"] + aux["clip_frac_low"] * tokens,
        "clip_frac_high": stats["clip_frac_high"] + aux["clip_frac_high"] * tokens,
        "kl_mean": stats["kl_mean"] + aux["kl_mean"] * tokens,
        "ratio_min": jnp.minimum(stats["ratio_min"], aux["ratio_min"]),
        "ratio_max": jnp.maximum(stats["ratio_max"], aux["ratio_max"]),
    }
    return (jax.tree.map(jnp.add, grads_acc, grads), stats), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  init = {k: jnp.zeros((), jnp.float32) for k in
          ("numerator", "denominator", "ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean")}
  init.update(ratio_min=jnp.array(jnp.inf, jnp.float32), ratio_max=jnp.array(-jnp.inf, jnp.float32))
  (grads_sum, stats), _ = jax.lax.scan(body, (zeros, init), micro)

  denominator = jnp.maximum(stats["denominator"], 1e-30)
  grads = jax.tree.map(lambda g: g / denominator, grads_sum)
  loss = stats["numerator"] / denominator
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  def apply(_):
    updates, new_opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt_state

  new_params, new_opt_state = jax.lax.cond(finite, apply, lambda _: (params, opt_state), None)
  per_token = jnp.maximum(n_tokens, 1).astype(jnp.float32)
  metrics = {
      "loss": loss,
      "grad_norm": grad_norm,
      "skipped": 1.0 - finite.astype(jnp.float32),
      # The learning rate this update used (the schedule's own step counter).
      "learning_rate": schedule(optax.tree_utils.tree_get(
          opt_state, "count", filtering=lambda path, _: path[-1].tuple_name == "ScaleByScheduleState")),
      "ratio/mean": stats["ratio_mean"] / per_token,
      "ratio/min": stats["ratio_min"],
      "ratio/max": stats["ratio_max"],
      "clip/low_frac": stats["clip_frac_low"] / per_token,
      "clip/high_frac": stats["clip_frac_high"] / per_token,
      "kl": stats["kl_mean"] / per_token,
  }
  return new_params, new_opt_state, metrics


def make_update(graphdef, spec: UpdateSpec, tx, schedule, *, param_shardings=None, opt_shardings=None):
  """`update` jitted once for the run, with the replaced params and optimizer state donated."""
  fn = functools.partial(update, graphdef, spec=spec, tx=tx, schedule=schedule)
  out_shardings = None
  if param_shardings is not None:
    out_shardings = (param_shardings, opt_shardings, None)
  return jax.jit(fn, donate_argnums=(0, 2), out_shardings=out_shardings)
