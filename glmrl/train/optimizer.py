"""AdamW with linear warmup, cosine decay and global-norm clipping."""

import optax


def learning_rate_schedule(optim_cfg, num_steps: int) -> optax.Schedule:
  """Linear warmup to the peak over `warmup_steps` updates, then cosine decay to zero at `num_steps`.

  Update k (counting from 0) uses the schedule's value at k + 1, so the first update is not a no-op.
  """
  warmup = min(optim_cfg.warmup_steps, num_steps)
  base = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=optim_cfg.learning_rate, warmup_steps=warmup,
      decay_steps=max(num_steps, warmup + 1), end_value=0.0)
  return lambda count: base(count + 1)


def make_optimizer(optim_cfg, num_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(optim_cfg, num_steps)
  tx = optax.chain(
      optax.clip_by_global_norm(optim_cfg.max_grad_norm),
      optax.adamw(schedule, b1=optim_cfg.b1, b2=optim_cfg.b2, weight_decay=optim_cfg.weight_decay),
  )
  return tx, schedule
