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
    before = [np.asarray(x) for x in jax.tree.leaves(trainer.states["ar"].trainable)]
    first = trainer.step()
    assert first["nonfinite/skipped_total"] == 1
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(before, jax.tree.leaves(trainer.states["ar"].trainable)))
    with pytest.raises(loop.NonFiniteError, match="2 consecutive steps"):
      trainer.step()
  finally:
    trainer.close()


@pytest.fixture
def prompt_length_reward():
  """A model-backed reward whose host-side `prepare` turns the prompts into arrays for the jitted scoring."""
  def factory(scale: float):
    prepare = lambda prompts, metadata: {"test_len": np.array([len(p) for p in prompts], np.float32)}
    return rewards.ModelReward(lambda images, prompts, metadata: scale * metadata["test_len"], prepare)
  rewards.register_factory("test_prompt_length", factory, pure_jax=True)
  yield "test_prompt_length"
  rewards.unregister("test_prompt_length")


def test_model_backed_reward_gets_its_prepared_inputs(tmp_path, prompt_length_reward):
  config = tiny_config()
  config.rewards = [{"name": prompt_length_reward, "weight": 1.0, "kwargs": {"scale": 0.5}}]
  trainer = loop.Trainer(config, str(tmp_path))
  try:
    order = trainer.run.iterator.epoch_order(0)[:config.data.prompts_per_step]
    scalars = trainer.step()
  finally:
    trainer.close()
  want = 0.5 * np.mean([len(trainer.run.records[i].prompt) for i in order])
  np.testing.assert_allclose(scalars["reward/mean"], want, rtol=1e-6)
