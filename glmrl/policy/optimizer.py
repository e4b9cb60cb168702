"""AdamW with linear warmup, cosine decay and global-norm clipping, counted in updates; float32 master
weights for parameters stored in a lower precision."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(optim_cfg, num_steps: int, num_iterations: int = 1) -> optax.Schedule:
  """The learning rate of update k (k = 0 .. U - 1, U = num_steps * num_iterations updates).

  The optimizer's counter advances once per update, and a rollout step makes `num_iterations` of
  them, so the schedule is sized in updates. `optim_cfg.warmup_steps` is in rollout steps (W =
  warmup_steps * num_iterations updates), so warmup spans the same rollouts whatever num_iterations.
  Warmup: update k < W runs at peak * (k + 1) / W (the first update is not a no-op, update W - 1
  reaches the peak). Then cosine from the peak at update P = max(W - 1, 0) to zero at update U, one
  past the last: every update, the final one included, has a positive learning rate.
  """
  updates = num_steps * num_iterations
  warmup = min(optim_cfg.warmup_steps * num_iterations, updates)
  peak_at = max(warmup - 1, 0)
  peak = optim_cfg.learning_rate

  def schedule(count):
    k = jnp.asarray(count, jnp.float32)
    ramp = peak * (k + 1.0) / max(warmup, 1)
    progress = jnp.clip((k - peak_at) / max(updates - peak_at, 1), 0.0, 1.0)
    cosine = 0.5 * peak * (1.0 + jnp.cos(jnp.pi * progress))
    return jnp.where(k < peak_at, ramp, cosine)

  return schedule


def make_optimizer(optim_cfg, num_steps: int, num_iterations: int = 1
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(optim_cfg, num_steps, num_iterations)
  tx = optax.chain(
      optax.clip_by_global_norm(optim_cfg.max_grad_norm),
      optax.adamw(schedule, b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps, weight_decay=optim_cfg.weight_decay),
  )
  return tx, schedule


class MasterWeights(NamedTuple):
  """Optimizer state of parameters kept in a lower precision than float32.

  AdamW's steps (learning rate x ~1, i.e. ~1e-6) are far below a bfloat16 ulp of weights of ~1e-2
  (~6e-5): applied to bfloat16 weights they round away. The optimizer updates this float32 copy
  instead; the low-precision parameters the forward reads are its rounding after every update.
  """
  params: Any  # float32 master copy of the trained parameters
  inner: Any   # the wrapped optimizer's state (float32 moments)


def needs_master(params) -> bool:
  return any(x.dtype != jnp.float32 for x in jax.tree.leaves(params))


def init(tx: optax.GradientTransformation, params):
  """Optimizer state of `params`: the plain state for float32 params, else MasterWeights around it."""
  if not needs_master(params):
    return tx.init(params)
  master = jax.tree.map(lambda x: x.astype(jnp.float32), params)
  return MasterWeights(master, tx.init(master))


def apply(tx: optax.GradientTransformation, grads, opt_state, params):
  """One optimizer step from float32 `grads`; returns (new params in their own dtype, new state)."""
  if isinstance(opt_state, MasterWeights):
    updates, inner = tx.update(grads, opt_state.inner, opt_state.params)
    master = optax.apply_updates(opt_state.params, updates)
    new_params = jax.tree.map(lambda m, p: m.astype(p.dtype), master, params)
    return new_params, MasterWeights(master, inner)
  updates, new_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), new_state


def update_count(opt_state) -> jax.Array:
  """The schedule's update counter (how many updates ran before the next one)."""
  return optax.tree_utils.tree_get(
      opt_state, "count", filtering=lambda path, _: path[-1].tuple_name == "ScaleByScheduleState")


def state_shardings(abstract_state, params, mesh: jax.sharding.Mesh):
  """Shardings of an optimizer state: each parameter-shaped leaf takes its parameter's, the rest replicate.

  A state leaf belongs to a parameter when its key path ends with the parameter's path and the shapes
  agree (AdamW moments and master copies mirror the parameter tree). Without this the state built by
  `init` under jit comes out replicated: every device would hold all of it.
  """
  by_path = {}
  for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
    by_path[tuple(path)] = p
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def one(path, leaf):
    path = tuple(path)
    for start in range(len(path)):
      p = by_path.get(path[start:])
      if p is not None and tuple(p.shape) == tuple(leaf.shape):
        return p.sharding
    return replicated

  return jax.tree_util.tree_map_with_path(one, abstract_state)
