"""The moving average of the trained parameters: its update rule and schedule against a float64 loop."""


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
  for step in range(1, 9):
    p = jnp.asarray(params[step], jnp.bfloat16)
    if settings.due(step):
      avg = ema.update(avg, {"w": p}, settings.decay_at(step))
      d = min(0.5, 0.1 * step)
      want = d * want + (1 - d) * np.asarray(p, np.float64)
  np.testing.assert_allclose(np.asarray(avg["w"]), want, rtol=1e-6)
  assert [settings.decay_at(s) for s in (1, 3, 5, 9)] == [0.1, 0.30000000000000004, 0.5, 0.5]
  assert [settings.due(s) for s in range(1, 5)] == [False, True, False, True]


def test_constant_decay_zero_copies_and_off_keeps_none():
  assert not ema.EmaSettings().enabled and not ema.EmaSettings().due(1)
  settings = ema.EmaSettings(decay=0.0, every=1)
  p = {"w": jnp.arange(4.0)}
  avg = ema.init(p)
  assert avg["w"] is not p["w"]  # its own buffer: the update donates it
  avg = ema.update(avg, {"w": p["w"] * 3}, settings.decay_at(7))
  np.testing.assert_array_equal(np.asarray(avg["w"]), np.arange(4.0) * 3)
  as_params = ema.as_params(avg, {"w": p["w"].astype(jnp.bfloat16)})
  assert as_params["w"].dtype == jnp.bfloat16



def diffusion_nft_decay(decay_type: int, step: int) -> float:
  """DiffusionNFT's `return_decay`, re-written (NVlabs/DiffusionNFT scripts/train_nft_sd3.py lines 169-189 at
  24af555): (flat, uprate, uphold) by decay type; 0 before `flat`, then min((step - flat) * uprate, uphold)."""
  flat, uprate, uphold = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}[decay_type]
  return 0.0 if step < flat else min((step - flat) * uprate, uphold)


def test_diffusion_nft_decay_types_as_settings():
  """Its types 1 and 2 (the OCR recipe's) as ema.ramp / ema.decay / ema.flat, every step of 300."""
  for decay_type, settings in ((1, ema.EmaSettings(decay=0.5, every=1, ramp=0.001)),
                               (2, ema.EmaSettings(decay=0.999, every=1, ramp=0.0075, flat=75))):
    got = [settings.decay_at(s) for s in range(300)]
    np.testing.assert_allclose(got, [diffusion_nft_decay(decay_type, s) for s in range(300)], rtol=1e-12, atol=0)
  flat = ema.EmaSettings(decay=0.999, every=1, ramp=0.0075, flat=75)
  assert flat.decay_at(74) == 0.0 and flat.decay_at(76) > 0.0 and flat.decay_at(299) == 0.999


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


def test_diffusion_nft_ocr_recipe_decays_as_its_training_loop_counts_them():
  """Its OCR recipe (config/nft.py `sd3_ocr`: decay_type 2, gradient_step_per_epoch=2), 300 rollouts: its numbers
  with steps_per_rollout=2 give its decay after every rollout; counted in rollouts they lag 2x (after rollout 100:
  0.1875 where it has 0.9375)."""
  want = diffusion_nft_old_policy_decays(2, 2, 300)
  ocr = ema.EmaSettings(decay=0.999, every=1, ramp=0.0075, flat=75, steps_per_rollout=2)
  np.testing.assert_allclose([ocr.decay_at(s) for s in range(1, 301)], want, rtol=1e-12, atol=0)
  per_rollout = ema.EmaSettings(decay=0.999, every=1, ramp=0.0075, flat=75)
  assert want[99] == pytest.approx(0.9375) and per_rollout.decay_at(100) == pytest.approx(0.1875)
  # Its default (decay_type 1, one gradient step per epoch) is the schedule counted in rollouts.
  default = ema.EmaSettings(decay=0.5, every=1, ramp=0.001)
  np.testing.assert_allclose([default.decay_at(s) for s in range(1, 301)], diffusion_nft_old_policy_decays(1, 1, 300),
                             rtol=1e-12, atol=0)


def dgpo_ema_ref_decays(optimizer_steps: int) -> list[float]:
  """The decay of each optimizer step's ema_ref update as DGPO's loop drives it (Luo-Yihong/DGPO
  scripts/train_sd3_dgpo.py at 01ceb4b): `ema_ref_decay = min(0.3, 0.001 * global_step)` and `ema_ref.step` after
  the optimizer's step (lines 1176-1177), `global_step += 1` after them (line 1210), global_step from 0."""
  global_step, out = 0, []
  for _ in range(optimizer_steps):
    out.append(min(0.3, 0.001 * global_step))
    global_step += 1
  return out


def test_dgpo_recipe_decays_its_average_as_its_training_loop_counts_them():
  """`:dgpo`'s rows (configs/released.py) give DGPO's decay at each of 300 updates: 0 at the first (its step is
  counted after the decay is read), 0.001 (n - 1) at the n-th, 0.3 from the 301st on."""
  from configs import demo_decoder
  from glmrl.policy import dit

  settings = dit.settings_of(demo_decoder.get_config("dgpo")).ema  # as the policy binds them
  np.testing.assert_allclose([settings.decay_at(s) for s in range(1, 301)], dgpo_ema_ref_decays(300), rtol=1e-12,
                             atol=1e-15)
  assert settings.decay_at(1) == 0.0 and settings.decay_at(302) == 0.3
