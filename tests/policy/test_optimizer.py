"""The learning-rate schedule counts updates (num_iterations per rollout step); master weights for bfloat16."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from glmrl.policy import optimizer


def optim_cfg(**kw):
  base = dict(learning_rate=1.0, warmup_steps=3, weight_decay=0.0, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1e9)
  return ml_collections.ConfigDict({**base, **kw})


def reference_rates(peak, warmup_steps, num_steps, num_iterations):
  """float64: linear warmup over W updates to the peak at update W - 1, cosine to 0 at update U (never run)."""
  u, w = num_steps * num_iterations, min(warmup_steps * num_iterations, num_steps * num_iterations)
  p = max(w - 1, 0)
  k = np.arange(u, dtype=np.float64)
  return np.where(k < p, peak * (k + 1) / max(w, 1), 0.5 * peak * (1 + np.cos(np.pi * (k - p) / (u - p))))


@pytest.mark.parametrize("num_iterations", [1, 2, 4])
def test_schedule_counts_updates(num_iterations):
  """Warmup spans warmup_steps rollout steps whatever num_iterations, reaches the peak, and the
  run's final update (num_steps * num_iterations - 1) has a positive learning rate."""
  cfg, steps = optim_cfg(), 10
  schedule = optimizer.learning_rate_schedule(cfg, steps, num_iterations)
  updates, warmup = steps * num_iterations, 3 * num_iterations
  values = np.array([float(schedule(k)) for k in range(updates)])
  np.testing.assert_allclose(values, reference_rates(1.0, 3, steps, num_iterations), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(values[:warmup], np.arange(1, warmup + 1) / warmup, rtol=1e-6)
  assert values[warmup - 1] == 1.0 and values.max() == 1.0
  assert np.all(np.diff(values[:warmup]) > 0) and np.all(np.diff(values[warmup - 1:]) < 0)
  assert values.min() > 0 and values[-1] > 0
  # The rollout step where the peak is reached does not depend on num_iterations.
  assert (warmup - 1) // num_iterations == 2


@pytest.mark.parametrize("eps", [1e-8, 1e-15])
def test_adam_epsilon_sets_how_far_tiny_gradients_move(eps):
  """optim.eps: a constant gradient g of 1e-10 moves a parameter by lr g / (|g| + eps) per step (bias-corrected
  moments m = g, v = g^2): 1% of the learning rate at the default 1e-8, all of it at 1e-15."""
  tx, _ = optimizer.make_optimizer(optim_cfg(learning_rate=1e-2, warmup_steps=0, eps=eps), 100)
  params = {"w": jnp.zeros((3,), jnp.float32)}
  grads = {"w": jnp.full((3,), 1e-10, jnp.float32)}
  updates, _ = tx.update(grads, tx.init(params), params)
  g = np.float64(np.float32(1e-10))
  np.testing.assert_allclose(np.asarray(updates["w"]), -1e-2 * g / (g + eps) * np.ones(3), rtol=1e-5)


@pytest.mark.parametrize("num_iterations", [1, 2, 4])
def test_every_update_runs_at_its_scheduled_rate(num_iterations):
  """Through the whole optimizer: with a constant gradient AdamW's step is -lr (bias-corrected moments
  m = g, v = g^2), so the applied update reads off the learning rate of each update in turn."""
  steps = 5
  tx, schedule = optimizer.make_optimizer(optim_cfg(learning_rate=1e-3, warmup_steps=2), steps, num_iterations)
  params = {"w": jnp.zeros((3,), jnp.float32)}
  grads = {"w": jnp.array([0.5, -2.0, 1.0], jnp.float32)}
  state = tx.init(params)
  applied = []
  for _ in range(steps * num_iterations):
    updates, state = tx.update(grads, state, params)
    applied.append(np.asarray(updates["w"], np.float64))
  applied = np.stack(applied)
  want = reference_rates(1e-3, 2, steps, num_iterations)
  # 1e-4 relative: AdamW's float32 bias correction 1 - b2^t cancels (1e-5 relative at t = 2), and it
  # divides by sqrt(v) + 1e-8. Neighbouring scheduled rates differ by far more.
  np.testing.assert_allclose(-applied * np.sign(np.asarray(grads["w"]))[None], np.repeat(want[:, None], 3, 1),
                             rtol=1e-4)
  assert np.all(applied != 0.0)  # not even the last update runs at learning rate 0
  assert int(optimizer.update_count(state)) == steps * num_iterations


def test_no_warmup_starts_at_the_peak():
  schedule = optimizer.learning_rate_schedule(optim_cfg(warmup_steps=0), 10, 2)
  values = np.array([float(schedule(k)) for k in range(20)])
  assert values[0] == 1.0 and np.all(np.diff(values) < 0) and values[-1] > 0


def test_bfloat16_params_follow_the_float32_run_through_master_weights():
  """The same gradients applied to float32 params and to their bfloat16 rounding: the master copy
  follows the float32 run exactly and the bfloat16 params are its rounding, even where each single
  step (1e-6) is far below a bfloat16 ulp of the weight (~6e-5 at 1e-2)."""
  tx, _ = optimizer.make_optimizer(optim_cfg(learning_rate=1e-6, warmup_steps=0), 1000)
  rng = np.random.default_rng(0)
  w0 = jnp.asarray(rng.normal(0, 1e-2, (256,)), jnp.bfloat16)  # bfloat16-representable start
  p32, p16 = {"w": w0.astype(jnp.float32)}, {"w": w0}
  s32, s16 = optimizer.init(tx, p32), optimizer.init(tx, p16)
  assert isinstance(s16, optimizer.MasterWeights) and not isinstance(s32, optimizer.MasterWeights)
  apply = jax.jit(lambda g, s, p: optimizer.apply(tx, g, s, p))
  for _ in range(100):
    g = {"w": jnp.asarray(rng.normal(0.3, 1.0, (256,)), jnp.float32)}
    p32, s32 = apply(g, s32, p32)
    p16, s16 = apply(g, s16, p16)
  assert p16["w"].dtype == jnp.bfloat16 and s16.params["w"].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(s16.params["w"]), np.asarray(p32["w"]))
  np.testing.assert_array_equal(np.asarray(p16["w"]), np.asarray(p32["w"].astype(jnp.bfloat16)))
  moved = np.asarray(p16["w"], np.float32) != np.asarray(w0, np.float32)
  assert moved.mean() > 0.5  # ~1e-4 of total movement crosses half an ulp for most weights
