import io

import glmrl  # noqa: F401
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from glmrl import rewards


def _pil_kb(image, quality):
  buf = io.BytesIO()
  Image.fromarray(image).save(buf, "JPEG", quality=quality)
  return len(buf.getvalue()) / 1000.0


@pytest.fixture(scope="module")
def images():
  rng = np.random.default_rng(0)
  imgs = rng.integers(0, 256, (3, 32, 64, 3), dtype=np.uint8)
  imgs[1] = 128
  return imgs


@pytest.mark.parametrize("quality", [None, 50])
def test_negative_kilobytes_golden(images, quality):
  kwargs = {} if quality is None else {"quality": quality}
  got = rewards.get("jpeg_compressibility")(images, ["a"] * 3, {}, **kwargs)
  want = [-_pil_kb(im, quality or 95) for im in images]
  assert got.dtype == np.float32 and got.shape == (3,)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got[1] > got[0]  # a flat image compresses better than noise


def test_accepts_jax_arrays(images):
  got = rewards.get("jpeg_compressibility")(jnp.asarray(images), None, {})
  np.testing.assert_array_equal(got, rewards.get("jpeg_compressibility")(images, None, {}))


@pytest.mark.parametrize("quality", [0, 101, 9.5])
def test_bad_quality(images, quality):
  with pytest.raises(ValueError, match=f"quality={quality}"):
    rewards.get("jpeg_compressibility")(images, None, {}, quality=quality)
