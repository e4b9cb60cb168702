import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.grpo import constant_groups, group_advantages
from tests.grpo import reference


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_matches_reference(scale, estimator):
  rewards = np.random.default_rng(0).normal(size=24).astype(np.float32)
  got = group_advantages(rewards, 4, scale=scale, estimator=estimator)
  want = reference.advantages(rewards, 4, scale, estimator)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_grpo_golden_values():
  # Group [1, 2, 3, 6]: mean 3, unbiased std sqrt(14/3).
  got = group_advantages(jnp.array([1.0, 2.0, 3.0, 6.0]), 4)
  np.testing.assert_allclose(got, np.array([-2, -1, 0, 3]) / np.sqrt(14 / 3), rtol=1e-6)
  # Batch scale: both group means are 3 and the unbiased std of all eight rewards is sqrt(28 / 7) = 2.
  got = group_advantages(jnp.array([1.0, 2.0, 3.0, 6.0, 0.0, 4.0, 5.0, 3.0]), 4, scale="batch")
  np.testing.assert_allclose(got, np.array([-2, -1, 0, 3, -3, 1, 2, 0]) / 2.0, rtol=1e-6)
  # RLOO without scaling: r_i - mean(others).
  got = group_advantages(jnp.array([1.0, 2.0, 3.0, 6.0]), 4, scale="none", estimator="rloo")
  np.testing.assert_allclose(got, [1 - 11 / 3, 2 - 10 / 3, 3 - 3, 6 - 2], rtol=1e-6)


@pytest.mark.parametrize("value", [0.1, 1e6 + 0.1, -3.3, 0.0])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_constant_group_is_exactly_zero(value, scale, estimator):
  rewards = jnp.array([value] * 5 + [1.0, 2.0, 4.0, 8.0, 9.0], jnp.float32)
  got = np.asarray(group_advantages(rewards, 5, scale=scale, estimator=estimator))
  assert np.all(got[:5] == 0.0) and not np.any(np.isnan(got))
  assert np.all(got[5:] != 0.0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_near_constant_group_is_zero(scale):
  """Rounding noise (a float32 ulp or two at 0.5 and at 1000) is not a signal."""
  noisy = [0.5, 0.50000006, 0.49999997, 0.5]
  offset = [1000.0, 1000.00006, 999.99994, 1000.0]
  rewards = np.array(noisy + offset + [0.2, 0.4, 0.9, 0.6], np.float32)
  got = np.asarray(group_advantages(rewards, 4, scale=scale))
  assert np.all(got[:8] == 0.0) and np.all(got[8:] != 0.0)
  np.testing.assert_allclose(got, reference.advantages(rewards, 4, scale), rtol=1e-5, atol=1e-6)
  # Without the threshold the noise of group 0 would be standardised to order-one advantages.
  unguarded = np.asarray(group_advantages(rewards, 4, scale="group", std_eps=0.0))
  assert np.max(np.abs(unguarded[:4])) > 0.5


@pytest.mark.parametrize("factor,zero", [(0.9, True), (1.1, False)])
def test_near_constant_threshold_is_relative_to_the_group_scale(factor, zero):
  # Group 0 = 100 + d * [-1, 1, -1, 1]: unbiased std d * sqrt(4/3), largest |r| 100 + d; d puts the std
  # at `factor` times the threshold std_eps * (100 + d).
  std_eps, k = 1e-3, factor * 1e-3 / np.sqrt(4 / 3)
  d = k * 100 / (1 - k)
  rewards = np.array([100 - d, 100 + d, 100 - d, 100 + d, 0.0, 0.5, 2.0, 1.5], np.float32)
  got = np.asarray(group_advantages(rewards, 4, std_eps=std_eps))
  assert np.all(got[:4] == 0.0) == zero
  np.testing.assert_allclose(got, reference.advantages(rewards, 4, std_eps=std_eps), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(constant_groups(rewards, 4, std_eps=std_eps), [zero, False])


def test_all_constant_batch_scale():
  got = group_advantages(jnp.full((8,), 0.7), 4, scale="batch")
  assert np.all(np.asarray(got) == 0.0)


def test_bfloat16_input_computes_in_float32():
  rewards = np.random.default_rng(1).normal(size=8)
  r16 = jnp.asarray(rewards, jnp.bfloat16)
  got = group_advantages(r16, 4)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, reference.advantages(np.asarray(r16, np.float64), 4), rtol=1e-5, atol=1e-6)


def test_jit_equals_eager():
  rewards = jnp.asarray(np.random.default_rng(2).normal(size=12), jnp.float32)
  jitted = jax.jit(lambda r: group_advantages(r, 3, scale="batch", estimator="rloo"))
  np.testing.assert_array_equal(jitted(rewards), group_advantages(rewards, 3, scale="batch", estimator="rloo"))


def test_errors():
  with pytest.raises(ValueError, match=r"10 is not divisible by group_size=4"):
    group_advantages(jnp.zeros(10), 4)
  with pytest.raises(ValueError, match=r"group_size=1"):
    group_advantages(jnp.zeros(4), 1)
  with pytest.raises(ValueError, match="scale='mean'"):
    group_advantages(jnp.zeros(4), 2, scale="mean")
  with pytest.raises(ValueError, match="estimator='ppo'"):
    group_advantages(jnp.zeros(4), 2, estimator="ppo")
  with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
    group_advantages(jnp.zeros((2, 2)), 2)
  with pytest.raises(ValueError, match=r"std_eps=-0.1 must be in \[0, 1\)"):
    group_advantages(jnp.zeros(4), 2, std_eps=-0.1)
