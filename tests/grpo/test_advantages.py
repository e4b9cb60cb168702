import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.grpo import group_advantages
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
  got = group_advantages(jnp.array([1.0, 2.0, 3.0, 6.0]), 4, eps=0.0)
  np.testing.assert_allclose(got, np.array([-2, -1, 0, 3]) / np.sqrt(14 / 3), rtol=1e-6)
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
