"""The one gradient accumulation and the one optimizer application every policy's update uses.

A policy's loss is sum(numerator) / sum(denominator) over its rollout, where the denominators do not
depend on the parameters. Its update runs the loss piece by piece (micro-batches, and for the decoder
timesteps of each), adds each piece's float32 gradient of the numerator and its statistics into one
carry (`add`), and divides once (`apply`): the full-batch gradient exactly, whatever the split.
Whatever the parameter dtype, the sum runs in float32: micro-batch gradients of bfloat16 params added
in bfloat16 lose the smaller pieces' contributions to rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from glmrl.policy import optimizer as optimizer_lib


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


def merge_micro(x_MxBx_):
  """The inverse of `split_micro` for a [m, B/m, ...] result: rows back in batch order."""
  if x_MxBx_ is None:
    return None
  return jnp.moveaxis(x_MxBx_, 0, 1).reshape(-1, *x_MxBx_.shape[2:])


def scan_steps(step, carry, rollout, micro_batches: int, steps: int):
  """The DiT policies' accumulation: `step(carry, mb, k) -> (carry, out)` over every micro-batch of `rollout`
  (`split_micro`) x trained step k in [0, steps); returns (carry, outs [B, steps, ...] in batch order, or None).
  One (micro-batch, step) pair at a time: activation memory is that of one step of one micro-batch."""
  def micro_batch(carry, mb):
    carry, out_WxB = jax.lax.scan(lambda c, k: step(c, mb, k), carry, jnp.arange(steps))
    return carry, jax.tree.map(lambda x_WxB: jnp.swapaxes(x_WxB, 0, 1), out_WxB)

  carry, out_MxBx_ = jax.lax.scan(micro_batch, carry, split_micro(rollout, micro_batches))
  return carry, jax.tree.map(merge_micro, out_MxBx_)


# Metric names of the statistics a loss may report (masked means, `add`'s `mean_stats`).
MEAN_METRICS = {"ratio_mean": "ratio/mean", "clip_frac_low": "clip/low_frac", "clip_frac_high": "clip/high_frac",
                "kl_mean": "kl", "ema_kl_mean": "ema_kl", "old_deviation": "old_deviation",
                "clip_frac_dual": "clip/dual_frac", "group_weight_mean": "dgpo/group_weight",
                "clip_frac": "dgpo/clip_frac"}


def init(params, mean_stats: tuple[str, ...], ratio: bool = True):
  """The empty carry of `add`: (float32 zero gradients, statistics). `ratio`: the loss has an importance ratio
  whose extremes are kept (a likelihood-free loss has none)."""
  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  stats = {k: jnp.zeros((), jnp.float32) for k in mean_stats + ("numerator", "denominator")}
  if ratio:
    stats.update(ratio_min=jnp.array(jnp.inf, jnp.float32), ratio_max=jnp.array(-jnp.inf, jnp.float32))
  return zeros, stats


def add(carry, grads, aux: dict, weight, mean_stats: tuple[str, ...]):
  """The carry plus one piece: its gradient (in float32), numerator and denominator summed, the
  `mean_stats` (masked means of the piece) summed weighted by `weight` (the piece's count), the ratio's
  extremes kept."""
  grads_acc, stats = carry
  new_stats = {k: stats[k] + aux[k] * weight for k in mean_stats}
  new_stats.update(numerator=stats["numerator"] + aux["numerator"],
                   denominator=stats["denominator"] + aux["denominator"])
  if "ratio_min" in stats:
    new_stats.update(ratio_min=jnp.minimum(stats["ratio_min"], aux["ratio_min"]),
                     ratio_max=jnp.maximum(stats["ratio_max"], aux["ratio_max"]))
  return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_acc, grads), new_stats


def apply(tx, schedule, params, opt_state, grads_sum, stats, count):
  """The optimizer step of an accumulated loss: (params, opt_state, metrics).

  grads = grads_sum / sum(denominator) (the full-batch gradient); a non-finite loss or gradient leaves
  params and optimizer state untouched and reports `skipped = 1`. The statistics' masked means
  (`MEAN_METRICS`, summed weighted by their counts) are divided by `count`.
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
  }
  metrics.update({name: stats[k] / count for k, name in MEAN_METRICS.items() if k in stats})
  if "ratio_min" in stats:
    metrics.update({"ratio/min": stats["ratio_min"], "ratio/max": stats["ratio_max"]})
  return new_params, new_opt_state, metrics


def jit_update(update, graphdef, *, spec, tx, schedule, param_shardings=None, opt_shardings=None):
  """A policy's `update(graphdef, params, frozen, opt_state, batch, ref_params, first, *, spec, tx,
  schedule)` jitted once for the run, called as fn(params, frozen, opt_state, batch, ref_params, first)
  with the replaced params and optimizer state donated. `first` is a traced bool, so the first and the
  later iterations of a rollout share one compiled program. The updated params and optimizer state keep
  the given shardings (the rules').
  """
  fn = functools.partial(update, graphdef, spec=spec, tx=tx, schedule=schedule)
  out_shardings = None if param_shardings is None else (param_shardings, opt_shardings, None, None)
  return jax.jit(fn, donate_argnums=(0, 2), out_shardings=out_shardings)
