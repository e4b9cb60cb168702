"""The steps nft, awm and dgpo train (`dit_matching.SlotDraw`): each repository's draw, and who shares a draw.

- "stratified" is AWM's `discrete_wo_init` (scxue/advantage_weighted_matching @ be51372,
  advantage_weighted_matching/scripts/train_sd3_awm.py lines 1198-1205), run here with torch on the same uniform
  draws: the same step indices exactly, at AWM's released setting (14 steps, fraction 0.9, 6 timesteps) and uneven
  ones; its strata's bounds equal torch's linspace wherever no bound is an exact integer (every schedule up to 120
  steps), and the exact integer where one is (torch's float32 can land below it).
- "micro_batch" sharing is AWM's loop (train_sd3_awm.py lines 1104-1112 cut one GPU's samples into
  micro-batches, line 1119 loops over them, line 1201 draws `rand_u` inside the loop): transcribed in numpy on the
  same uniform draws, each data shard's rows of each update micro-batch train AWM's integers for that GPU's
  micro-batch, GPU by GPU and micro-batch by micro-batch in turn, evenly split and not.
- "high_noise" is DGPO's `random.sample(range(trunc_steps + 1), M)` (Luo-Yihong/DGPO @ 01ceb4b,
  scripts/train_sd3_dgpo.py lines 1062-1064 and 52-74): Python's RNG cannot be shared, so its law is checked, M
  distinct steps of the first trunc_steps + 1, each taken with probability M / (trunc_steps + 1) (30,000 draws,
  within 0.01, over 5 standard deviations).
- "uniform" is the draw as it was before the setting existed, bit for bit (the documented runs keep their numbers).
"""

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import demo_decoder
from glmrl.policy import accumulate, awm, dgpo, nft
from glmrl.policy import dit_matching as dm


def awm_discrete_wo_init(num_steps: int, timestep_fraction: float, train_timesteps: int, rand_u) -> np.ndarray:
  """AWM's lines 1198-1205 with torch, `rand_u` [train_timesteps] given (its `torch.rand`)."""
  import torch  # pylint: disable=import-outside-toplevel

  boundaries = torch.linspace(1, int(num_steps * timestep_fraction), steps=train_timesteps + 1)
  lower_bounds = boundaries[:-1].long()
  upper_bounds = boundaries[1:].long()
  rand_u = torch.as_tensor(np.array(rand_u))
  t_indices = lower_bounds + (rand_u * (upper_bounds - lower_bounds)).long()
  return t_indices.numpy()


@pytest.mark.parametrize("steps,fraction,slots", [(14, 0.9, 6), (10, 0.9, 3), (7, 0.75, 4), (20, 0.5, 9)])
def test_stratified_is_awms_discrete_wo_init_on_the_same_draws(steps, fraction, slots):
  draw = dm.SlotDraw(kind="stratified", fraction=fraction)
  key, draws = jax.random.key(3), 64
  got = np.asarray(draw.indices(key, steps, draws, slots))
  rand_u = np.asarray(jax.random.uniform(key, (draws, slots)))  # the draws `indices` makes
  want = np.stack([awm_discrete_wo_init(steps, fraction, slots, u) for u in rand_u])
  np.testing.assert_array_equal(got, want)
  assert got.min() >= 1 and got.max() < int(steps * fraction)  # never step 0 (sigma 1) nor the last steps
  assert (np.diff(got, axis=1) > 0).all()  # one per stratum, in order


def awm_loop_t_indices(num_steps, timestep_fraction, train_timesteps, gpus, micro_batches, rand_u) -> np.ndarray:
  """int [gpus, micro_batches, train_timesteps]: AWM's `discrete_wo_init` t_indices of each GPU's micro-batches in
  its loop's order (lines 1119, 1198-1205), in numpy: `rand_u` [gpus x micro_batches, train_timesteps] its
  torch.rand draws, one per micro-batch, GPU 0's first."""
  boundaries = np.linspace(1, int(num_steps * timestep_fraction), train_timesteps + 1)
  lower, upper = boundaries[:-1].astype(np.int64), boundaries[1:].astype(np.int64)
  out = np.zeros((gpus, micro_batches, train_timesteps), np.int64)
  draw = 0
  for gpu in range(gpus):
    for i in range(micro_batches):
      out[gpu, i] = lower + (rand_u[draw] * (upper - lower)).astype(np.int64)
      draw += 1
  return out


@pytest.mark.parametrize("rows,shards,micro,steps,slots", [
    (48, 4, 12, 14, 6),  # AWM's released 14 steps, 6 timesteps; 3 rows of each micro-batch on each shard
    (24, 8, 12, 10, 3)])  # micro-batches of 12 over 8 shards: uneven, 1 or 2 rows of one on a shard
def test_micro_batch_sharing_is_awms_loop_over_each_gpus_micro_batches(rows, shards, micro, steps, slots):
  policy = awm.AwmPolicy(_config("awm", timestep_sharing="micro_batch", micro_batch_size=micro, train_steps=steps,
                                 train_timesteps=slots, timestep_draw="stratified", stratified_fraction=0.9))
  model_timesteps = jnp.arange(steps, 0, -1, dtype=jnp.float32) * 1000.0 / steps
  sigmas = jnp.linspace(1.0, 0.0, steps + 1)
  key, m = jax.random.key(5), rows // micro
  timesteps, _ = policy.trained_slots(key, model_timesteps, sigmas, rows, 4, shards)
  got = np.asarray(timesteps)
  rand_u = np.asarray(jax.random.uniform(key, (shards * m, slots)))  # the draws `indices` makes
  want = awm_loop_t_indices(steps, 0.9, slots, shards, m, rand_u)
  micro_rows = np.asarray(accumulate.split_micro(jnp.arange(rows), m))  # [m, rows / m]: the update's micro-batches
  seen = 0
  for gpu in range(shards):
    block = set(range(gpu * rows // shards, (gpu + 1) * rows // shards))  # the rows shard `gpu` holds
    for i in range(m):
      members = [r for r in micro_rows[i] if r in block]
      assert members, (gpu, i)
      np.testing.assert_array_equal(got[members], np.broadcast_to(np.asarray(model_timesteps)[want[gpu, i]],
                                                                  (len(members), slots)), err_msg=f"{gpu} {i}")
      seen += len(members)
  assert seen == rows
  assert len({tuple(r) for r in got}) > 1  # draws differ (almost surely)


def test_stratum_bounds_are_torchs_linspace_or_the_exact_integer_it_rounds_below():
  import torch  # pylint: disable=import-outside-toplevel

  for top in range(2, 121):
    for slots in range(1, top):
      got = dm.stratum_bounds(top, slots)
      want = torch.linspace(1, top, steps=slots + 1).long().numpy()
      exact = [(i * (top - 1)) % slots == 0 for i in range(slots + 1)]
      np.testing.assert_array_equal(got[~np.asarray(exact)], want[~np.asarray(exact)], err_msg=f"{top} {slots}")
      assert all(want[i] in (got[i], got[i] - 1) for i in range(slots + 1) if exact[i]), (top, slots)


def test_high_noise_draws_distinct_steps_of_the_first_ones_uniformly():
  draw = dm.SlotDraw(kind="high_noise", high_noise_steps=3)
  got = np.asarray(draw.indices(jax.random.key(0), 10, 30000, 2))
  assert got.min() == 0 and got.max() == 2
  assert (got[:, 0] != got[:, 1]).all()
  frequency = np.bincount(got.ravel(), minlength=3) / got.shape[0]
  np.testing.assert_allclose(frequency, 2 / 3, atol=0.01)


def test_uniform_is_the_draw_it_was():
  key, steps, draws, slots = jax.random.key(6), 10, 12, 4
  before = jnp.argsort(jax.random.uniform(key, (draws, steps)), axis=1)[:, :slots]
  np.testing.assert_array_equal(np.asarray(dm.SlotDraw().indices(key, steps, draws, slots)), np.asarray(before))


def _config(algorithm, **decoder):
  config = demo_decoder.get_config(algorithm)
  for k, v in decoder.items():
    config.decoder[k] = v
  return config


@pytest.mark.parametrize("cls,algorithm,sharing,per_draw", [
    (nft.NftPolicy, "nft", "image", 1), (awm.AwmPolicy, "awm", "group", 4), (awm.AwmPolicy, "awm", "batch", 16),
    (dgpo.DgpoPolicy, "dgpo", "image", 4),  # its groups share their noise: per group at least
    (dgpo.DgpoPolicy, "dgpo", "batch", 16)])
def test_who_shares_a_draw(cls, algorithm, sharing, per_draw):
  """16 rows in groups of 4: rows of one draw train the same steps, other draws (almost surely) other ones."""
  policy = cls(_config(algorithm, timestep_sharing=sharing, train_steps=10, train_timesteps=3))
  model_timesteps = jnp.arange(1000.0, 0.0, -100.0)
  sigmas = jnp.linspace(1.0, 0.0, 11)
  timesteps, got_sigmas = policy.trained_slots(jax.random.key(1), model_timesteps, sigmas, 16, 4)
  assert timesteps.shape == got_sigmas.shape == (16, 3)
  np.testing.assert_allclose(np.asarray(got_sigmas), np.asarray(timesteps) / 1000.0, rtol=1e-6)  # paired
  rows = np.asarray(timesteps).reshape(16 // per_draw, per_draw, 3)
  assert (rows == rows[:, :1]).all()
  assert len(rows) == 1 or len({tuple(r[0]) for r in rows}) > 1
