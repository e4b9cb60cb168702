"""The image drift's SSIM against scikit-image's (the same Gaussian window and constants, float64), its RMSE
against the formula, and the thumbnails it compares."""

import numpy as np
import pytest

from glmrl.evaluation import drift


def images(seed, b=3, h=40, w=52):
  rng = np.random.default_rng(seed)
  base = rng.integers(0, 256, (b, h, w, 3), dtype=np.uint8)
  noisy = np.clip(base.astype(np.int64) + rng.normal(0, 25, base.shape).round().astype(np.int64), 0, 255)
  return base, noisy.astype(np.uint8)


@pytest.mark.parametrize("seed", [0, 1])
def test_ssim_matches_skimage(seed):
  from skimage.metrics import structural_similarity

  base, noisy = images(seed)
  want = [structural_similarity(a, b, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                data_range=255, channel_axis=-1) for a, b in zip(noisy, base)]
  np.testing.assert_allclose(drift.ssim(noisy, base), want, rtol=1e-10)


def test_distances_are_zero_for_the_same_image_and_rmse_is_the_formula():
  base, noisy = images(2)
  same = drift.distances(base, base)
  np.testing.assert_array_equal(same["drift/ssim"], 0.0)
  np.testing.assert_array_equal(same["drift/rmse"], 0.0)
  got = drift.distances(noisy, base, lpips=lambda a, b: np.full(len(a), 0.25))
  want = [np.sqrt(np.mean(((a / 255.0) - (b / 255.0)) ** 2)) for a, b in zip(noisy.astype(float), base)]
  np.testing.assert_allclose(got["drift/rmse"], want, rtol=1e-12)
  assert np.all(got["drift/ssim"] > 0.01) and np.all(got["drift/lpips"] == 0.25)


def test_thumbnails_keep_small_images_and_shrink_large_ones_to_the_side():
  small = np.zeros((2, 64, 48, 3), np.uint8)
  assert drift.thumbnails(small) is small or np.array_equal(drift.thumbnails(small), small)
  large = np.zeros((2, 1024, 512, 3), np.uint8)
  assert drift.thumbnails(large).shape == (2, 256, 128, 3)
