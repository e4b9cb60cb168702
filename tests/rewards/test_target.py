import glmrl  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl import rewards

TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def pair():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
  target = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
  target[2] = images[2]  # identical pair
  return images, target


def _ref_mse(images, target):
  d = images.astype(np.float64) / 255 - target.astype(np.float64) / 255
  return (d ** 2).mean(axis=(1, 2, 3))


def test_neg_mse_golden(pair):
  images, target = pair
  got = rewards.get("target_neg_mse")(images, ["a"] * 3, {"target_image": target})
  np.testing.assert_allclose(got, -_ref_mse(images, target), **TOL)
  assert got[2] == 0.0


def test_psnr_golden_and_cap(pair):
  images, target = pair
  mse = _ref_mse(images, target)
  got = rewards.get("target_psnr")(images, None, {"target_image": target})
  np.testing.assert_allclose(got[:2], 10 * np.log10(1 / mse[:2]), **TOL)
  np.testing.assert_allclose(got[2], 100.0, **TOL)
  capped = rewards.get("target_psnr")(images, None, {"target_image": target}, max_db=40.0)
  np.testing.assert_allclose(capped[2], 40.0, **TOL)


def test_jit_with_jax_arrays(pair):
  images, target = pair
  fn = jax.jit(lambda x, t: rewards.get("target_psnr")(x, None, {"target_image": t}))
  want = rewards.get("target_psnr")(images, None, {"target_image": target})
  np.testing.assert_allclose(fn(jnp.asarray(images), jnp.asarray(target)), want, **TOL)


def test_errors(pair):
  images, target = pair
  with pytest.raises(ValueError, match=r"needs metadata\['target_image'\]; metadata has keys \['other'\]"):
    rewards.get("target_neg_mse")(images, None, {"other": 1})
  with pytest.raises(ValueError, match=r"target_image shape \(2, 32, 32, 3\) != images shape"):
    rewards.get("target_neg_mse")(images, None, {"target_image": target[:2]})
  with pytest.raises(ValueError, match="max_db=0"):
    rewards.get("target_psnr")(images, None, {"target_image": target}, max_db=0)
