"""Golden values from independent float64 numpy formulas."""

import glmrl  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl import rewards

TOL = dict(rtol=1e-5, atol=1e-6)


def _images():
  rng = np.random.default_rng(0)
  imgs = rng.integers(0, 256, (4, 16, 24, 3), dtype=np.uint8)
  imgs[1] = 0            # black
  imgs[2] = (255, 0, 0)  # pure red
  return imgs


def _ref_brightness(imgs):
  x = imgs.astype(np.float64) / 255
  return (0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]).mean(axis=(1, 2))


def _ref_colorfulness(imgs):
  x = imgs.astype(np.float64) / 255
  rg = (x[..., 0] - x[..., 1]).reshape(len(x), -1)
  yb = (0.5 * (x[..., 0] + x[..., 1]) - x[..., 2]).reshape(len(x), -1)
  return np.hypot(rg.std(1), yb.std(1)) + 0.3 * np.hypot(rg.mean(1), yb.mean(1))


def _ref_saturation(imgs):
  x = imgs.astype(np.float64) / 255
  hi, lo = x.max(-1), x.min(-1)
  with np.errstate(invalid="ignore", divide="ignore"):
    s = np.where(hi > 0, (hi - lo) / hi, 0.0)
  return s.mean(axis=(1, 2))


@pytest.mark.parametrize("name,ref", [("brightness", _ref_brightness), ("colorfulness", _ref_colorfulness),
                                      ("saturation", _ref_saturation)])
def test_matches_numpy_reference_eager_and_jit(name, ref):
  imgs = _images()
  fn = rewards.get(name)
  want = ref(imgs)
  eager = fn(imgs, ["p"] * 4, {})
  jitted = jax.jit(lambda x: fn(x, None, {}))(jnp.asarray(imgs))
  assert eager.shape == (4,) and eager.dtype == jnp.float32
  np.testing.assert_allclose(eager, want, **TOL)
  np.testing.assert_allclose(jitted, want, **TOL)


def test_hand_computed_values():
  imgs = _images()
  # Black: 0 everywhere. Pure red: luma 0.299, saturation 1, rg = 1, yb = 0.5 -> 0.3 * sqrt(1.25).
  np.testing.assert_allclose(rewards.get("brightness")(imgs, None, {})[1:3], [0.0, 0.299], **TOL)
  np.testing.assert_allclose(rewards.get("saturation")(imgs, None, {})[1:3], [0.0, 1.0], **TOL)
  np.testing.assert_allclose(rewards.get("colorfulness")(imgs, None, {})[1:3], [0.0, 0.3 * np.sqrt(1.25)], **TOL)


@pytest.mark.parametrize("name", ["brightness", "colorfulness", "saturation"])
def test_rejects_bad_images(name):
  with pytest.raises(ValueError, match="images must be uint8"):
    rewards.get(name)(np.zeros((2, 8, 8, 3), np.float32), None, {})
  with pytest.raises(ValueError, match=r"images must be \[B, H, W, 3\]"):
    rewards.get(name)(np.zeros((8, 8, 3), np.uint8), None, {})
