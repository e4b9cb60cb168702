"""Condition-image preprocessing of GLM-Image (numpy/PIL, no torch).

Resize (bicubic, to a multiple of `patch_size * merge_size`), rescale to [0, 1],
normalise with the CLIP mean/std and cut into the packed patch layout the
vision encoder reads: `pixel_values` [num_patches, C * T * P * P] (float32) and
`grid_thw` [num_images, 3] (int64), numerically equal to transformers'
`GlmImageImageProcessorPil`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig:
  """The processor's `preprocessor_config.json` values that change the output."""
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  image_mean: tuple[float, float, float] = CLIP_MEAN
  image_std: tuple[float, float, float] = CLIP_STD
  rescale_factor: float = 1 / 255
  resample: int = int(Image.Resampling.BICUBIC)
  do_resize: bool = True
  do_rescale: bool = True
  do_normalize: bool = True

  def __post_init__(self):
    for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    if len(self.image_mean) != 3 or len(self.image_std) != 3:
      raise ValueError(f"image_mean={self.image_mean!r} and image_std={self.image_std!r} need 3 values")

  @property
  def factor(self) -> int:
    """Resized sides are multiples of this."""
    return self.patch_size * self.merge_size

  @classmethod
  def from_hf(cls, d: Mapping[str, Any]) -> "ImageProcessorConfig":
    """From a `preprocessor_config.json` dict (or the `image_processor` entry of `processor_config.json`)."""
    size = dict(d.get("size") or {})
    # Older files spell the pixel budget as min_pixels/max_pixels.
    min_pixels = d.get("min_pixels", size.get("shortest_edge", cls.min_pixels))
    max_pixels = d.get("max_pixels", size.get("longest_edge", cls.max_pixels))
    return cls(
        patch_size=int(d.get("patch_size", cls.patch_size)),
        temporal_patch_size=int(d.get("temporal_patch_size", cls.temporal_patch_size)),
        merge_size=int(d.get("merge_size", cls.merge_size)),
        min_pixels=int(min_pixels),
        max_pixels=int(max_pixels),
        image_mean=tuple(float(x) for x in d.get("image_mean", cls.image_mean)),
        image_std=tuple(float(x) for x in d.get("image_std", cls.image_std)),
        rescale_factor=float(d.get("rescale_factor", cls.rescale_factor)),
        resample=int(d.get("resample", cls.resample)),
        do_resize=bool(d.get("do_resize", True)),
        do_rescale=bool(d.get("do_rescale", True)),
        do_normalize=bool(d.get("do_normalize", True)),
    )

  def to_hf(self) -> dict:
    """Keyword arguments `GlmImageImageProcessorPil(**d)` accepts (and a valid preprocessor_config.json)."""
    return {
        "image_processor_type": "GlmImageImageProcessor",
        "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
        "patch_size": self.patch_size,
        "temporal_patch_size": self.temporal_patch_size,
        "merge_size": self.merge_size,
        "image_mean": list(self.image_mean),
        "image_std": list(self.image_std),
        "rescale_factor": self.rescale_factor,
        "resample": self.resample,
        "do_resize": self.do_resize,
        "do_rescale": self.do_rescale,
        "do_normalize": self.do_normalize,
        "do_convert_rgb": True,
    }

  @classmethod
  def full(cls) -> "ImageProcessorConfig":
    """Layout the released vision encoder reads (16 px patches, no merge, one frame).

    The released preprocessor_config.json is not available offline: patch/merge/temporal
    sizes follow from the released vision config (the patch embedding reads exactly
    C*16*16 values per patch and `spatial_merge_size` is 1); the pixel budget keeps the
    reference class defaults. Prefer `from_hf` on the checkpoint's file.
    """
    return cls(patch_size=16, temporal_patch_size=1, merge_size=1)

  @classmethod
  def tiny(cls) -> "ImageProcessorConfig":
    """Small images for tests (4 px patches, 16x16 .. 64x64 pixels)."""
    return cls(patch_size=4, temporal_patch_size=1, merge_size=1, min_pixels=16 * 16, max_pixels=64 * 64)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
  """Resized (height, width): multiples of `factor` inside the pixel budget.

  Mirrors the reference exactly, including its halving of both sides before
  rounding (GLM-Image conditions on half-resolution images).
  """
  if height < factor or width < factor:
    raise ValueError(f"image height={height} or width={width} is smaller than the patch factor {factor}")
  if max(height, width) / min(height, width) > 4:
    raise ValueError(f"image aspect ratio {max(height, width) / min(height, width)} (height={height}, "
                     f"width={width}) must be at most 4")
  shortest = int(round(math.sqrt(min_pixels)))
  longest = int(round(math.sqrt(max_pixels)))
  scale = 1.0
  if min(height, width) < shortest:
    scale = shortest / min(height, width)
  if max(height, width) * scale > longest:
    scale = longest / max(height, width)
  h_bar = max(factor, int(round((height // 2) * scale / factor)) * factor)
  w_bar = max(factor, int(round((width // 2) * scale / factor)) * factor)
  if max(h_bar, w_bar) > longest:
    beta = max(h_bar, w_bar) / longest
    h_bar = max(factor, int(math.floor((h_bar / beta) / factor)) * factor)
    w_bar = max(factor, int(math.floor((w_bar / beta) / factor)) * factor)
  return h_bar, w_bar


def to_rgb(image) -> Image.Image:
  """A PIL RGB image; transparency is composited onto white like the reference."""
  if isinstance(image, np.ndarray):
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[-1] not in (1, 3, 4)):
      raise ValueError(f"image arrays must be uint8 [H, W], [H, W, 1|3|4]; got {image.dtype} {image.shape}")
    image = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image)
  if not isinstance(image, Image.Image):
    raise ValueError(f"image must be a PIL image or a uint8 numpy array, got {type(image).__name__}")
  if "A" in image.getbands() or image.info.get("transparency") is not None:
    rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")
  return image.convert("RGB")


def patchify(image_Cxhxw: np.ndarray, cfg: ImageProcessorConfig) -> tuple[np.ndarray, int, int]:
  """[C, H, W] -> ([gh * gw, C * T * P * P], gh, gw), patches ordered merge-block by merge-block."""
  c, h, w = image_Cxhxw.shape
  p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
  gh, gw = h // p, w // p
  x = image_Cxhxw.reshape(c, gh // m, m, p, gw // m, m, p)
  x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, P, P]
  # A still image fills every temporal slot of a patch with the same frame.
  x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (t,) + x.shape[5:])
  return np.ascontiguousarray(x).reshape(gh * gw, c * t * p * p), gh, gw


def preprocess_one(image, cfg: ImageProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
  """One image -> (patches [gh * gw, C*T*P*P] float32, (1, gh, gw))."""
  pil = to_rgb(image)
  if cfg.do_resize:
    h, w = smart_resize(pil.height, pil.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    pil = pil.resize((w, h), resample=Image.Resampling(cfg.resample))
  elif pil.height % cfg.factor or pil.width % cfg.factor:
    raise ValueError(f"without resizing the image size {pil.height}x{pil.width} must be a multiple of {cfg.factor}")
  x = np.asarray(pil).transpose(2, 0, 1)
  if cfg.do_rescale:
    # float64 product then float32, the same rounding as the reference.
    x = (x.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
  x = x.astype(np.float32)
  if cfg.do_normalize:
    mean = np.asarray(cfg.image_mean, np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, np.float32)[:, None, None]
    x = (x - mean) / std
  patches, gh, gw = patchify(x, cfg)
  return patches, (1, gh, gw)


def preprocess(images: Sequence, cfg: ImageProcessorConfig) -> tuple[np.ndarray, np.ndarray]:
  """Images -> (pixel_values [sum(gh*gw), C*T*P*P] float32, grid_thw [num_images, 3] int64)."""
  if isinstance(images, (np.ndarray, Image.Image)) or len(images) == 0:
    raise ValueError(f"images must be a non-empty sequence of images, got {type(images).__name__}")
  out = [preprocess_one(im, cfg) for im in images]
  pixel_values = np.concatenate([p for p, _ in out], axis=0)
  grid_thw = np.asarray([g for _, g in out], dtype=np.int64)
  return pixel_values, grid_thw


def num_image_tokens(grid_thw: Sequence[int], cfg: ImageProcessorConfig) -> int:
  """Placeholder tokens one image occupies in the prompt (t * h * w / merge^2)."""
  t, h, w = (int(v) for v in grid_thw)
  return t * h * w // (cfg.merge_size ** 2)
