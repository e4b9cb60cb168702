"""The moving average of the trained parameters: its update rule and schedule against a float64 loop."""


import types

import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.policy import ema


def test_update_rule_and_ramped_schedule_match_a_float64_loop():
  settings = ema.EmaSettings(decay=0.5, every=2, ramp=0.1)
  rng = np.random.default_rng(0)
  params = [rng.standard_normal((3, 2)) for _ in range(9)]
  avg = ema.init({"w": jnp.asarray(params[0], jnp.bfloat16)})
  assert avg["w"].dtype == jnp.float32
  want = np.asarray(jnp.asarray(params[0], jnp.bfloat16), np.float64)
  for step in range(1, 9):  # one optimizer step per rollout: the count after rollout `step` is `step`
    p = jnp.asarray(params[step], jnp.bfloat16)
    if settings.due("rollout", step):
      avg = ema.update(avg, {"w": p}, step, settings)
      d = min(0.5, 0.1 * step)
      want = d * want + (1 - d) * np.asarray(p, np.float64)
  np.testing.assert_allclose(np.asarray(avg["w"]), want, rtol=1e-6)
  # The decay is a float32 the update's program computes: within one float32 ulp of the float64 schedule.
  np.testing.assert_array_max_ulp(np.asarray([settings.decay_at(s) for s in (1, 3, 5, 9)]),
                                  np.float32([0.1, 0.3, 0.5, 0.5]), maxulp=1)
  assert [settings.due("rollout", s) for s in range(1, 5)] == [False, True, False, True]
  assert not settings.due("update", 2)  # it updates after rollouts, not after optimizer steps


def test_constant_decay_zero_copies_and_off_keeps_none():
  assert not ema.EmaSettings().enabled and not ema.EmaSettings().due("rollout", 1)
  settings = ema.EmaSettings(decay=0.0, every=1)
  p = {"w": jnp.arange(4.0)}
  avg = ema.init(p)
  assert avg["w"] is not p["w"]  # its own buffer: the update donates it
  avg = ema.update(avg, {"w": p["w"] * 3}, 7, settings)
  np.testing.assert_array_equal(np.asarray(avg["w"]), np.arange(4.0) * 3)
  as_params = ema.as_params(avg, {"w": p["w"].astype(jnp.bfloat16)})
  assert as_params["w"].dtype == jnp.bfloat16


def _decays_as_glmrl_drives_them(settings: ema.EmaSettings, rollouts: int, num_iterations: int) -> list[float]:
  """The decay of each update of the average as the training loop makes them (`glmrl.train.loop.Trainer.step`):
  per rollout `num_iterations` real optimizer steps (optax's AdamW as `glmrl.policy.optimizer` builds it), the
  average folded after each (`after="update"`) and after the rollout's last (`"rollout"`) by
  `PolicyState.update_ema`, its count read from the optimizer state. Each fold starts from an average of 1 and
  parameters of 0, so that it leaves its decay exactly; one that is not due leaves 1."""
  from glmrl.policy import optimizer
  from glmrl.policy.state import PolicyState

  optim = types.SimpleNamespace(learning_rate=1e-3, warmup_steps=0, max_grad_norm=1.0, b1=0.9, b2=0.999, eps=1e-8,
                                weight_decay=0.0)
  tx, _ = optimizer.make_optimizer(optim, rollouts, num_iterations)
  ones, zeros = {"w": jnp.ones((2,), jnp.float32)}, {"w": jnp.zeros((2,), jnp.float32)}
  state = types.SimpleNamespace(ema_settings=settings, trainable=zeros, opt_state=optimizer.init(tx, ones), ema=None)
  out = []

  def fold(after, rollout):
    state.ema = {"w": jnp.ones((2,), jnp.float32)}
    PolicyState.update_ema(state, after, rollout)
    decay = float(np.asarray(state.ema["w"])[0])
    if decay != 1.0:
      out.append(decay)

  for rollout in range(1, rollouts + 1):
    for _ in range(num_iterations):
      _, state.opt_state = optimizer.apply(tx, ones, state.opt_state, ones)
      fold("update", rollout)
    fold("rollout", rollout)
  return out


def diffusion_nft_decay(decay_type: int, step: int) -> float:
  """DiffusionNFT's `return_decay`, re-written (NVlabs/DiffusionNFT scripts/train_nft_sd3.py lines 169-189 at
  24af555): (flat, uprate, uphold) by decay type; 0 before `flat`, then min((step - flat) * uprate, uphold)."""
  flat, uprate, uphold = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}[decay_type]
  return 0.0 if step < flat else min((step - flat) * uprate, uphold)


def test_diffusion_nft_decay_types_as_settings():
  """Its types 1 and 2 (the OCR recipe's) as ema.ramp / ema.decay / ema.flat, every step of 300."""
  for decay_type, settings in ((1, ema.EmaSettings(decay=0.5, every=1, ramp=0.001)),
                               (2, ema.EmaSettings(decay=0.999, every=1, ramp=0.0075, flat=75))):
    got = np.asarray([settings.decay_at(s) for s in range(300)])
    np.testing.assert_array_max_ulp(got, np.float32([diffusion_nft_decay(decay_type, s) for s in range(300)]),
                                    maxulp=1)
  flat = ema.EmaSettings(decay=0.999, every=1, ramp=0.0075, flat=75)
  assert flat.decay_at(74) == 0.0 and flat.decay_at(76) > 0.0 and flat.decay_at(299) == np.float32(0.999)


def diffusion_nft_old_policy_decays(decay_type: int, gradient_steps_per_epoch: int, epochs: int) -> list[float]:
  """The decay of each epoch's old-policy update as DiffusionNFT's loop drives `return_decay`
  (scripts/train_nft_sd3.py at 24af555): `global_step += 1` after each gradient step of the epoch (line 1021),
  then after the epoch's updates `decay = return_decay(global_step, config.decay_type)` (line 1035)."""
  global_step, out = 0, []
  for _ in range(epochs):
    for _ in range(gradient_steps_per_epoch):
      global_step += 1
    out.append(diffusion_nft_decay(decay_type, global_step))
  return out


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_diffusion_nft_recipes_decay_as_its_training_loop_counts_them(num_iterations):
  """300 optimizer steps: its default (decay_type 1) and its OCR recipe (config/nft.py `sd3_ocr`: decay_type 2,
  gradient_step_per_epoch=2), the average folded after each rollout at the optimizer's count, against its loop at
  as many gradient steps per epoch as glmrl's updates per rollout (float32: one ulp)."""
  rollouts = 300 // num_iterations
  for decay_type, settings in ((1, ema.EmaSettings(decay=0.5, every=1, ramp=0.001)),
                               (2, ema.EmaSettings(decay=0.999, every=1, ramp=0.0075, flat=75))):
    got = _decays_as_glmrl_drives_them(settings, rollouts, num_iterations)
    want = diffusion_nft_old_policy_decays(decay_type, num_iterations, rollouts)
    np.testing.assert_array_max_ulp(np.float32(got), np.float32(want), maxulp=1)
  # The OCR recipe after 100 gradient steps: 0.1875, reached at rollout 50 with two steps per rollout.
  assert diffusion_nft_old_policy_decays(2, 2, 300)[49] == pytest.approx(0.1875)


def dgpo_ema_ref_decays(optimizer_steps: int) -> list[float]:
  """The decay of each optimizer step's ema_ref update as DGPO's loop drives it (Luo-Yihong/DGPO
  scripts/train_sd3_dgpo.py at 01ceb4b): `ema_ref_decay = min(0.3, 0.001 * global_step)` and `ema_ref.step` after
  the optimizer's step (lines 1176-1177), `global_step += 1` after them (line 1210), global_step from 0."""
  global_step, out = 0, []
  for _ in range(optimizer_steps):
    out.append(min(0.3, 0.001 * global_step))
    global_step += 1
  return out


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_dgpo_recipe_decays_its_average_as_its_training_loop_counts_them(num_iterations):
  """`:dgpo`'s rows (configs/released.py), as the policy binds them, give DGPO's decay at each of 300 optimizer
  steps, folded after every step whatever the steps per rollout: 0 at the first (its step is counted after the
  decay is read), 0.001 (n - 1) at the n-th, 0.3 from the 301st on (float32: one ulp)."""
  from configs import demo_decoder
  from glmrl.policy import dit

  settings = dit.settings_of(demo_decoder.get_config("dgpo")).ema
  got = _decays_as_glmrl_drives_them(settings, 300 // num_iterations, num_iterations)
  np.testing.assert_array_max_ulp(np.float32(got), np.float32(dgpo_ema_ref_decays(300)), maxulp=1)
  assert settings.decay_at(1) == 0.0 and settings.decay_at(302) == np.float32(0.3)


def awm_kl_ema_decays(gradient_steps_per_epoch: int, epochs: int) -> list[float]:
  """The decay of each epoch's update of AWM's KL average as its loop drives it (scxue/advantage_weighted_matching
  advantage_weighted_matching/scripts/train_sd3_awm.py at be51372): `global_step += 1` after each optimizer step
  of the epoch, then after the epoch's training `decay = min(config.train.kl_ema_decay, 0.001 * global_step)`
  (line 1413)."""
  global_step, out = 0, []
  for _ in range(epochs):
    global_step += gradient_steps_per_epoch
    out.append(min(0.3, 0.001 * global_step))
  return out


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_awm_recipe_decays_its_average_as_its_training_loop_counts_them(num_iterations):
  from configs import demo_decoder
  from glmrl.policy import dit

  settings = dit.settings_of(demo_decoder.get_config("awm")).ema
  rollouts = 300 // num_iterations
  got = _decays_as_glmrl_drives_them(settings, rollouts, num_iterations)
  np.testing.assert_array_max_ulp(np.float32(got), np.float32(awm_kl_ema_decays(num_iterations, rollouts)),
                                  maxulp=1)


def test_the_average_of_every_kth_update_keeps_the_others():
  settings = ema.EmaSettings(decay=0.25, every=3, after="update")
  assert _decays_as_glmrl_drives_them(settings, 3, 2) == [0.25, 0.25]  # after the 3rd and the 6th step
