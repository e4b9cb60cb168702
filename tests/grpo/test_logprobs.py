import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.grpo import token_logprobs
from tests.grpo import reference


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.5])
def test_matches_reference(temperature):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 4
  tokens = rng.integers(0, 11, size=(3, 5))
  got = token_logprobs(logits, tokens, temperature)
  assert got.shape == (3, 5) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, reference.log_softmax_pick(logits, tokens, temperature), atol=1e-5)


def test_numerically_stable_for_huge_logits():
  logits = jnp.array([[1e4, 1e4 - 1.0, -1e4]], jnp.float32)
  got = token_logprobs(logits, jnp.array([1]))
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, [-1.0 - np.log1p(np.exp(-1.0))], atol=1e-5)


def test_bfloat16_logits_give_float32():
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, 9)), jnp.bfloat16)
  tokens = jnp.arange(4)
  got = token_logprobs(logits, tokens)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, reference.log_softmax_pick(np.asarray(logits, np.float64), tokens), atol=1e-5)


def test_jit_and_gradient():
  logits = jnp.asarray(np.random.default_rng(2).normal(size=(2, 7)), jnp.float32)
  tokens = jnp.array([3, 5])
  np.testing.assert_allclose(jax.jit(token_logprobs)(logits, tokens, 0.9), token_logprobs(logits, tokens, 0.9), atol=1e-6)
  # d log p_k / d z = (onehot_k - softmax(z)) / T.
  grad = jax.grad(lambda z: token_logprobs(z, tokens, 0.9).sum())(logits)
  want = (jax.nn.one_hot(tokens, 7) - jax.nn.softmax(logits / 0.9)) / 0.9
  np.testing.assert_allclose(grad, want, atol=1e-5)


def test_errors():
  with pytest.raises(ValueError, match=r"logits shape \(2, 3, 5\) does not match tokens shape \(2,\)"):
    token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2,), jnp.int32))
  with pytest.raises(ValueError, match="temperature=0"):
    token_logprobs(jnp.zeros((2, 5)), jnp.zeros((2,), jnp.int32), 0)
  with pytest.raises(ValueError, match="must be integers"):
    token_logprobs(jnp.zeros((2, 5)), jnp.zeros((2,), jnp.float32))
