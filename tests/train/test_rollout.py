"""The rollout's scoring (advantages, dropped groups) and its log-prob metrics, against float64 references."""

import glmrl  # noqa: F401

import jax.numpy as jnp
import numpy as np
import pytest

from glmrl import rewards
from glmrl.train import rollout as rollout_lib
from tests.grpo import reference

# Group 0: float32 rounding noise around 0.5; group 1: a real spread.
REWARDS = np.array([0.5, 0.50000006, 0.49999997, 0.5, 0.2, 0.4, 0.9, 0.6], np.float32)


@pytest.fixture(scope="module")
def given_reward():
  rewards.register("test_given", lambda images, prompts, metadata: metadata["r"], pure_jax=True)
  yield "test_given"
  rewards.unregister("test_given")


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("drop", [False, True])
def test_near_constant_group_gets_zero_advantages_and_is_dropped(given_reward, normalize, drop):
  composer = rewards.RewardComposer([{"name": given_reward, "weight": 2.0, "normalize": normalize}], group_size=4,
                                    std_eps=1e-5)
  images = jnp.zeros((8, 8, 8, 3), jnp.uint8)
  total, _ = composer.score(images, [""] * 8, {"r": REWARDS})
  advantages, keep_B, zero_var = rollout_lib.advantage_stats(
      total, group_size=4, scale="group", estimator="grpo", std_eps=composer.std_eps, drop_constant=drop)
  # Per-reward normalisation uses the advantages' std convention and threshold: the noise group is 0.
  want_total = 2.0 * (reference.advantages(REWARDS, 4) if normalize else REWARDS.astype(np.float64))
  np.testing.assert_allclose(total, want_total, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(advantages, reference.advantages(np.asarray(total), 4), rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(advantages)[:4] == 0.0) and zero_var == 0.5
  np.testing.assert_array_equal(keep_B, [0.0] * 4 + [1.0] * 4 if drop else [1.0] * 8)
