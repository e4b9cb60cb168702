"""JPEG compressibility (host-side, PIL), the DDPO / Flow-GRPO compression reward."""

import io

import numpy as np
from PIL import Image

from glmrl.rewards.registry import check_images, register


def jpeg_compressibility(images, prompts, metadata, quality: int = 95):
  """Negative JPEG size in kB (1000 bytes) at a fixed `quality`; smaller files score higher."""
  if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)) or not 1 <= quality <= 100:
    raise ValueError(f"reward 'jpeg_compressibility': quality={quality!r} must be an integer in [1, 100]")
  images = np.asarray(images)
  check_images(images, "jpeg_compressibility")
  sizes = []
  for image in images:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=int(quality))
    sizes.append(buf.tell() / 1000.0)
  return -np.asarray(sizes, np.float32)


register("jpeg_compressibility", jpeg_compressibility, pure_jax=False)
