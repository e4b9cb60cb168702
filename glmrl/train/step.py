"""The GRPO policy update: one jitted function, micro-batched with exact loss accumulation.

There is no separate old-log-prob pass. The first update of a rollout (`first=True`) takes
old = stop_gradient(new) inside its own micro-batch loss: its ratio is exp(0) = 1 exactly, for
every dtype, mesh and micro-batch size, and a forward of the model per step is saved. It returns
those log-probs (and, with the KL term, the reference policy's, computed by the same function on the
same micro-batches), and later iterations (`first=False`) read them: old and new log-probs come
from the same program on the same shapes.
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
from glmrl.models import lora as lora_lib
from glmrl.models.ar.prompt import GenerationLayout
from glmrl.sampling.logprobs import SamplingConfig, teacher_forced_logprobs
from glmrl.train import optimizer as optimizer_lib


@struct.dataclass
class Rollout:
  """What the update needs of one rollout batch (all [B, ...], sharded over the batch axes)."""
  sequence_ids: jax.Array  # [B, S] prompt + generated tokens
  positions: jax.Array     # [3, B, S]
  valid: jax.Array         # [B, S] False on left padding
  sampler_logp: jax.Array  # [B, N] the sampler's own log-probs of the generated tokens
  old_logp: jax.Array      # [B, N] the learner's, before the first update (which computes them; NaN until then)
  advantages: jax.Array    # [B]
  mask: jax.Array          # [B, N] 1 for tokens in the loss, 0 for dropped groups
  ref_logp: jax.Array | None = None  # [B, N] under the frozen initial policy (beta > 0; as old_logp)


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
  tis_cap: float = 0.0
  # The KL term's reference policy: "params" (the `ref_params` passed in, a copy of the initial
  # policy) or "adapters_off" (LoRA: these params with every adapter's B zeroed, i.e. the base).
  reference: str = "params"


def rollout_logprobs(graphdef, params, frozen, rollout: Rollout, spec: UpdateSpec) -> jax.Array:
  """Log-probs [B, N] of the rollout's generated tokens under `params` (the one log-prob function)."""
  # Fresh Variables (copy=True copies no arrays): remat'd layers write back to their Variables, which
  # jax.grad refuses for ones made outside its trace, such as frozen base weights under LoRA.
  model = nnx.merge(graphdef, params, frozen, copy=True)
  return teacher_forced_logprobs(model, rollout.sequence_ids, rollout.positions, rollout.valid,
                                 prompt_len=spec.prompt_len, layout=spec.layout, cfg=spec.sampling,
                                 chunk_size=spec.logprob_chunk, remat=spec.remat)


def _micro_loss(params, graphdef, frozen, mb: Rollout, first, spec: UpdateSpec):
  logp = rollout_logprobs(graphdef, params, frozen, mb, spec)
  # The policy that sampled is `params` itself on the first iteration: its log-probs are these very
  # values (no second evaluation that could round differently), held constant.
  old_logp = jnp.where(first, jax.lax.stop_gradient(logp), mb.old_logp)
  max_tokens = logp.shape[1] if spec.aggregation == "seq_mean_token_sum_norm" else None
  _, aux = grpo.policy_loss(
      logp, old_logp, mb.advantages, mb.mask, epsilon_low=spec.epsilon_low, epsilon_high=spec.epsilon_high,
      ref_logp=mb.ref_logp, beta=spec.beta, kl=spec.kl, aggregation=spec.aggregation, max_tokens=max_tokens,
      sampler_logp=mb.sampler_logp, tis_cap=spec.tis_cap)
  return aux["numerator"], (aux, old_logp)


def split_micro(tree, m: int):
  """[B, ...] -> [m, B/m, ...] strided: micro-batch i holds rows i, i + m, i + 2m, ... (positions
  [3, B, S] -> [m, 3, B/m, S]).

  The batch is sharded over data x fsdp in contiguous row blocks; strided micro-batches take rows from
  every block, so each spans every device and the scan slices it in place (contiguous ones would each
  sit on a few devices and be re-gathered every iteration).
  """
  def one(path, x):
    if x is None:
      return None
    if path and getattr(path[-1], "name", None) == "positions":
      return jnp.moveaxis(x.reshape(3, -1, m, x.shape[-1]), 2, 0)
    return jnp.moveaxis(x.reshape(-1, m, *x.shape[1:]), 1, 0)
  return jax.tree_util.tree_map_with_path(one, tree)


def merge_micro(x_MxBxN):
  """The inverse of `split_micro` for a [m, B/m, N] result: rows back in batch order."""
  if x_MxBxN is None:
    return None
  return jnp.moveaxis(x_MxBxN, 0, 1).reshape(-1, x_MxBxN.shape[-1])


# Token-weighted means of the micro-batches (summed as mean x tokens, divided by all tokens at the end).
_MEAN_STATS = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean", "tis_weight_mean", "tis_capped_frac")


def accumulate_gradients(graphdef, params, frozen, rollout: Rollout, ref_params, first, *, spec: UpdateSpec):
  """Summed float32 gradient of the loss numerators over the micro-batches, and the loss statistics.

  Returns (grads_sum, stats, old_logp [B, N], ref_logp [B, N] or None). Whatever the parameter dtype,
  the sum runs in float32: micro-batch gradients of bfloat16 params added in bfloat16 lose the
  smaller micro-batches' contributions to rounding. With `first`, old_logp are the log-probs this
  forward computed (and ref_logp those of `ref_params`, by the same function on the same
  micro-batch); otherwise the rollout's, passed through.
  """
  grad_fn = jax.grad(_micro_loss, has_aux=True)
  micro = split_micro(rollout, spec.micro_batches)
  if spec.reference == "adapters_off" and rollout.ref_logp is not None:
    ref_params = lora_lib.adapters_off(params)
  use_ref = ref_params is not None and rollout.ref_logp is not None

  def body(carry, mb):
    grads_acc, stats = carry
    ref_logp = None
    if use_ref:
      ref_logp = jax.lax.cond(
          first, lambda: jax.lax.stop_gradient(rollout_logprobs(graphdef, ref_params, frozen, mb, spec)),
          lambda: mb.ref_logp)
      mb = mb.replace(ref_logp=ref_logp)
    grads, (aux, old_logp) = grad_fn(params, graphdef, frozen, mb, first, spec)
    tokens = jnp.sum(mb.mask > 0).astype(jnp.float32)
    new_stats = {k: stats[k] + aux[k] * tokens for k in _MEAN_STATS}
    new_stats.update(
        numerator=stats["numerator"] + aux["numerator"], denominator=stats["denominator"] + aux["denominator"],
        ratio_min=jnp.minimum(stats["ratio_min"], aux["ratio_min"]),
        ratio_max=jnp.maximum(stats["ratio_max"], aux["ratio_max"]))
    grads_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_acc, grads)
    return (grads_acc, new_stats), (old_logp, ref_logp)

  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  init = {k: jnp.zeros((), jnp.float32) for k in _MEAN_STATS + ("numerator", "denominator")}
  init.update(ratio_min=jnp.array(jnp.inf, jnp.float32), ratio_max=jnp.array(-jnp.inf, jnp.float32))
  (grads_sum, stats), (old_MxBxN, ref_MxBxN) = jax.lax.scan(body, (zeros, init), micro)
  return grads_sum, stats, merge_micro(old_MxBxN), merge_micro(ref_MxBxN)


def update(graphdef, params, frozen, opt_state, rollout: Rollout, ref_params=None, first=True, *,
           spec: UpdateSpec, tx: optax.GradientTransformation, schedule):
  """One optimizer step on the rollout; returns (params, opt_state, metrics, (old_logp, ref_logp)).

  `first`: this is the rollout's first update (old log-probs = this forward's; see the module
  docstring). The gradient of loss = sum(numerator) / sum(denominator) is accumulated over
  micro-batches as sum(grad numerator) / sum(denominator), which equals the full-batch gradient
  exactly (the denominators do not depend on the parameters). A non-finite loss or gradient leaves
  params and optimizer state untouched and reports `skipped = 1`.
  """
  grads_sum, stats, old_logp, ref_logp = accumulate_gradients(graphdef, params, frozen, rollout, ref_params,
                                                              first, spec=spec)
  per_token = jnp.maximum(jnp.sum(rollout.mask > 0), 1).astype(jnp.float32)
  new_params, new_opt_state, metrics = apply_accumulated(tx, schedule, params, opt_state, grads_sum, stats,
                                                         per_token)
  if spec.tis_cap:
    metrics["tis/weight_mean"] = stats["tis_weight_mean"] / per_token
    metrics["tis/capped_frac"] = stats["tis_capped_frac"] / per_token
  return new_params, new_opt_state, metrics, (old_logp, ref_logp)


def apply_accumulated(tx, schedule, params, opt_state, grads_sum, stats, count):
  """The optimizer step of an accumulated loss: (params, opt_state, metrics).

  grads = grads_sum / sum(denominator) (the full-batch gradient); a non-finite loss or gradient leaves
  params and optimizer state untouched and reports `skipped = 1`. The statistics' masked means
  (`ratio_mean`, `clip_frac_*`, `kl_mean`, summed weighted by their counts) are divided by `count`.
  """
  denominator = jnp.maximum(stats["denominator"], 1e-30)
  grads = jax.tree.map(lambda g: g / denominator, grads_sum)
  loss = stats["numerator"] / denominator
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  new_params, new_opt_state = jax.lax.cond(
      finite, lambda: optimizer_lib.apply(tx, grads, opt_state, params), lambda: (params, opt_state))
  metrics = {
      "loss": loss,
      "grad_norm": grad_norm,
      "skipped": 1.0 - finite.astype(jnp.float32),
      # The learning rate this update used (the schedule's own update counter).
      "learning_rate": schedule(optimizer_lib.update_count(opt_state)),
      "ratio/mean": stats["ratio_mean"] / count,
      "ratio/min": stats["ratio_min"],
      "ratio/max": stats["ratio_max"],
      "clip/low_frac": stats["clip_frac_low"] / count,
      "clip/high_frac": stats["clip_frac_high"] / count,
      "kl": stats["kl_mean"] / count,
  }
  return new_params, new_opt_state, metrics


def make_update(graphdef, spec: UpdateSpec, tx, schedule, *, param_shardings=None, opt_shardings=None):
  """`update` jitted once for the run, with the replaced params and optimizer state donated.

  Called as fn(params, frozen, opt_state, rollout, ref_params, first); `first` is a traced bool, so
  the first and the later iterations of a rollout share one compiled program.
  """
  fn = functools.partial(update, graphdef, spec=spec, tx=tx, schedule=schedule)
  out_shardings = None
  if param_shardings is not None:
    out_shardings = (param_shardings, opt_shardings, None, None)
  return jax.jit(fn, donate_argnums=(0, 2), out_shardings=out_shardings)
