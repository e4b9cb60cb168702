"""How far a checkpoint's images moved from the base model's at the same prompt and seed: reward hacking made
visible where it happens (OCR RL that paints text over the picture, a decoder that drifts off the base's content).

Each image is compared with the base's image of the same prompt and sample (evaluation samples with fixed seeds),
both reduced to at most `SIDE` pixels on their longer side (the comparison is of content, and the base's images are
kept on the host for the whole comparison):
- `drift/ssim`: 1 - SSIM (Wang et al. 2004, "Image quality assessment: from error visibility to structural
  similarity": Gaussian window sigma 1.5 truncated at 3.5 sigma, K1 0.01, K2 0.03, the per-channel mean of the
  SSIM map), 0 for the same image;
- `drift/rmse`: the root mean square pixel difference on [0, 1];
- `drift/lpips`: LPIPS (VGG, `glmrl.models.lpips`) when config.eval.drift_lpips_dir names converted weights.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy import ndimage

SIDE = 256  # longest side the images are compared at
_K1, _K2, _SIGMA, _TRUNCATE = 0.01, 0.03, 1.5, 3.5


def thumbnails(images_BxHxWx3: np.ndarray, side: int = SIDE) -> np.ndarray:
  """uint8 images reduced (bicubic) so that their longer side is at most `side`; unchanged when already smaller."""
  images_BxHxWx3 = np.asarray(images_BxHxWx3)
  h, w = images_BxHxWx3.shape[1:3]
  scale = side / max(h, w)
  if scale >= 1:
    return images_BxHxWx3
  size = (max(1, round(w * scale)), max(1, round(h * scale)))
  return np.stack([np.asarray(Image.fromarray(x).resize(size, Image.BICUBIC)) for x in images_BxHxWx3])


def ssim(a_BxHxWx3: np.ndarray, b_BxHxWx3: np.ndarray) -> np.ndarray:
  """[B] SSIM of uint8 image pairs (data range 255), each channel's map averaged, in float64."""
  a, b = np.asarray(a_BxHxWx3, np.float64), np.asarray(b_BxHxWx3, np.float64)
  if a.shape != b.shape:
    raise ValueError(f"images {a.shape} and {b.shape} differ in shape")
  c1, c2 = (_K1 * 255.0) ** 2, (_K2 * 255.0) ** 2
  blur = lambda x: ndimage.gaussian_filter(x, sigma=(0, _SIGMA, _SIGMA, 0), truncate=_TRUNCATE, mode="reflect")
  mu_a, mu_b = blur(a), blur(b)
  var_a, var_b, cov = blur(a * a) - mu_a ** 2, blur(b * b) - mu_b ** 2, blur(a * b) - mu_a * mu_b
  ssim_map = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
  # The map's border, where the window reaches past the image, is left out (as skimage crops it).
  pad = int(_TRUNCATE * _SIGMA + 0.5)
  return ssim_map[:, pad:-pad or None, pad:-pad or None, :].mean(axis=(1, 2, 3))


def distances(images_BxHxWx3: np.ndarray, base_BxHxWx3: np.ndarray, lpips=None) -> dict:
  """{"drift/ssim", "drift/rmse"[, "drift/lpips"]: [B]} of images against the base's (same shape; `thumbnails` of
  both). `lpips`: a function of two uint8 batches returning [B] distances, or None."""
  a, b = np.asarray(images_BxHxWx3), np.asarray(base_BxHxWx3)
  out = {"drift/ssim": 1.0 - ssim(a, b),
         "drift/rmse": np.sqrt(np.mean(((a.astype(np.float64) - b) / 255.0) ** 2, axis=(1, 2, 3)))}
  if lpips is not None:
    out["drift/lpips"] = np.asarray(lpips(a, b), np.float64)
  return out
