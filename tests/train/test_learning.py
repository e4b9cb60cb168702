"""The demo setup learns: the mean reward of a short run rises, and non-finite rewards are handled."""

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl import rewards
from glmrl.train import loop
from tests.train.common import tiny_config


def test_reward_rises_on_a_short_run(tmp_path):
  config = tiny_config(train__num_steps=30, grpo__group_size=8, checkpoint__save_interval=100)
  trainer = loop.Trainer(config, str(tmp_path))
  try:
    curve = [trainer.step()["reward/mean"] for _ in range(config.train.num_steps)]
  finally:
    trainer.close()
  first, last = np.mean(curve[:5]), np.mean(curve[-5:])
  # The within-group reward spread of the random decoder is ~0.005; require a rise of twice that.
  assert last - first > 0.01, curve


@pytest.fixture
def nan_reward():
  rewards.register("test_nan", lambda images, prompts, metadata: jnp.full(images.shape[:1], jnp.nan),
                   pure_jax=True)
  yield "test_nan"
  rewards.unregister("test_nan")


def test_nonfinite_rewards_skip_updates_then_stop(tmp_path, nan_reward):
  config = tiny_config(train__max_consecutive_nonfinite=2)
  config.rewards = [{"name": nan_reward, "weight": 1.0}]
  trainer = loop.Trainer(config, str(tmp_path))
  try:
    before = [np.asarray(x) for x in jax.tree.leaves(trainer.params)]
    first = trainer.step()
    assert first["nonfinite/skipped_total"] == 1
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(before, jax.tree.leaves(trainer.params)))
    with pytest.raises(loop.NonFiniteError, match="2 consecutive steps"):
      trainer.step()
  finally:
    trainer.close()
