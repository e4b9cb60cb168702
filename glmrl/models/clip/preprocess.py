"""CLIPImageProcessor's preprocessing on device: shortest-side resize, center crop, rescale, normalise; and
OpenCLIP's longest-side resize and padding (HPS v2.1's `ResizeMaxSize`), resized as floats.

The reference resizes with PIL on uint8 images: a separable antialiased filter (PIL's bicubic is the
Keys kernel with a = -0.5, widened by the downscale factor), horizontal pass first, each pass rounded
and clipped to uint8. `jax.image.scale_and_translate` with antialiasing uses the same kernel, support
and per-pixel weight normalisation, so running it one axis at a time with the same rounding matches
PIL up to PIL's 22-bit fixed-point filter coefficients (an occasional 1/255 step where a value falls
on a rounding boundary; tests/models/clip/test_preprocess.py measures it). OpenCLIP's preprocessing turns the
image into floats first and resizes those with torch's antialiased bicubic (the same kernel and support, no
rounding): `uint8_passes=False`. Output shapes depend only on the static input shape, so the whole function jits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from glmrl.models.config_fields import check_positive_ints

# transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD, used by every CLIP checkpoint here.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# Where a centre crop starts, from the margin: CLIPImageProcessor's floor(margin / 2), or torchvision's CenterCrop
# (ImageReward's transform): int(round(margin / 2)), Python's round, so a margin of 75 starts at 38 and one of 73 at 36.
CROP_ROUNDING = {"floor": lambda margin: margin // 2, "round": lambda margin: int(round(margin / 2.0))}
# PIL resampling codes (PILImageResampling) -> jax.image kernels with the same shape.
RESAMPLE = {2: "linear", 3: "cubic"}


def _size_dict(value, name: str) -> dict:
  if isinstance(value, int) and not isinstance(value, bool):
    return {"shortest_edge": value} if name == "size" else {"height": value, "width": value}
  if isinstance(value, dict):
    return dict(value)
  raise ValueError(f"preprocessor {name}={value!r} must be an int or a dict")


@dataclasses.dataclass(frozen=True)
class ImageProcessing:
  """The fields of a CLIP `preprocessor_config.json` that matter; defaults are CLIPImageProcessor's.

  `shortest_edge` resizes keeping the aspect ratio (the long side is floor(long * edge / short));
  `resize_height` / `resize_width` (both set, `shortest_edge` None) resize to an exact size; `longest_edge`
  (`shortest_edge` None) scales the long side to it and the short one to round(short * edge / long), as
  OpenCLIP's `ResizeMaxSize`, and `pad_size` then pads the image to pad_size x pad_size with zeros, centred
  (the extra row or column at the bottom and right). `uint8_passes`: each resize pass is rounded to uint8 as PIL
  stores it (CLIPImageProcessor), or kept in floats (OpenCLIP, torch's resize of a float tensor). `crop_rounding`:
  where the centre crop starts (`CROP_ROUNDING`).
  """
  do_resize: bool = True
  shortest_edge: int | None = 224
  resize_height: int | None = None
  resize_width: int | None = None
  longest_edge: int | None = None
  resample: int = 3
  uint8_passes: bool = True
  pad_size: int | None = None
  do_center_crop: bool = True
  crop_rounding: str = "floor"
  crop_height: int = 224
  crop_width: int = 224
  do_rescale: bool = True
  rescale_factor: float = 1 / 255
  do_normalize: bool = True
  image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
  image_std: tuple[float, ...] = OPENAI_CLIP_STD

  def __post_init__(self):
    object.__setattr__(self, "image_mean", tuple(float(m) for m in self.image_mean))
    object.__setattr__(self, "image_std", tuple(float(s) for s in self.image_std))
    if self.resample not in RESAMPLE:
      raise ValueError(f"resample={self.resample!r} is not supported (PIL codes {sorted(RESAMPLE)}: "
                       "2 bilinear, 3 bicubic)")
    exact = (self.resize_height, self.resize_width)
    given = [self.shortest_edge is not None, None not in exact, self.longest_edge is not None]
    if self.do_resize and sum(given) != 1:
      raise ValueError(f"give one of shortest_edge, longest_edge or both resize_height and resize_width, got "
                       f"shortest_edge={self.shortest_edge}, longest_edge={self.longest_edge}, "
                       f"resize=({self.resize_height}, {self.resize_width})")
    check_positive_ints(self, ("shortest_edge", "resize_height", "resize_width", "longest_edge", "pad_size",
                               "crop_height", "crop_width"), optional=True)
    if self.crop_rounding not in CROP_ROUNDING:
      raise ValueError(f"crop_rounding={self.crop_rounding!r} is not one of {sorted(CROP_ROUNDING)}")
    if self.pad_size is not None and self.do_center_crop:
      raise ValueError(f"pad_size={self.pad_size} and do_center_crop: pad or crop, not both")
    if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
      raise ValueError(f"image_mean={self.image_mean} / image_std={self.image_std} must be 3 values, std > 0")

  @classmethod
  def from_hf(cls, d: dict) -> "ImageProcessing":
    """From a `preprocessor_config.json` dict (new `{"shortest_edge": n}` or legacy int sizes)."""
    values: dict[str, Any] = {k: d[k] for k in ("do_resize", "resample", "do_center_crop", "do_rescale",
                                               "rescale_factor", "do_normalize", "image_mean", "image_std")
                              if d.get(k) is not None}
    if d.get("size") is not None:
      size = _size_dict(d["size"], "size")
      if "shortest_edge" in size:
        values["shortest_edge"] = size["shortest_edge"]
      elif "height" in size and "width" in size:
        values.update(shortest_edge=None, resize_height=size["height"], resize_width=size["width"])
      else:
        raise ValueError(f"preprocessor size={d['size']!r} needs shortest_edge or height and width")
    if d.get("crop_size") is not None:
      crop = _size_dict(d["crop_size"], "crop_size")
      if "height" not in crop or "width" not in crop:
        raise ValueError(f"preprocessor crop_size={d['crop_size']!r} needs height and width")
      values.update(crop_height=crop["height"], crop_width=crop["width"])
    return cls(**values)

  def to_hf(self) -> dict:
    """A dict `CLIPImageProcessor(**d)` accepts (which has no longest-side resize, padding, float passes or
    rounded crop offsets)."""
    if (self.longest_edge is not None or self.pad_size is not None or not self.uint8_passes
        or self.crop_rounding != "floor"):
      raise ValueError(f"{self} has no CLIPImageProcessor counterpart (longest_edge, pad_size, float passes, "
                       "crop_rounding)")
    size = ({"shortest_edge": self.shortest_edge} if self.shortest_edge is not None
            else {"height": self.resize_height, "width": self.resize_width})
    return dict(do_resize=self.do_resize, size=size, resample=self.resample, do_center_crop=self.do_center_crop,
                crop_size={"height": self.crop_height, "width": self.crop_width}, do_rescale=self.do_rescale,
                rescale_factor=self.rescale_factor, do_normalize=self.do_normalize,
                image_mean=list(self.image_mean), image_std=list(self.image_std))

  @classmethod
  def full(cls, **overrides) -> "ImageProcessing":
    """224 x 224, as openai/clip-vit-large-patch14 and laion/CLIP-ViT-H-14 ship it."""
    return cls(**overrides)

  @classmethod
  def tiny(cls, size: int = 32, **overrides) -> "ImageProcessing":
    return cls(**{"shortest_edge": size, "crop_height": size, "crop_width": size, **overrides})

  def resized_hw(self, height: int, width: int) -> tuple[int, int]:
    """The (height, width) after resizing (host-side, as transformers computes it)."""
    if not self.do_resize:
      return height, width
    if self.longest_edge is not None:
      scale = self.longest_edge / float(max(height, width))
      # Python's round, as ResizeMaxSize computes it (halves to even).
      return (height, width) if scale == 1.0 else (round(height * scale), round(width * scale))
    if self.shortest_edge is None:
      return self.resize_height, self.resize_width
    short, long = min(height, width), max(height, width)
    new_long = int(self.shortest_edge * long / short)
    return (new_long, self.shortest_edge) if width <= height else (self.shortest_edge, new_long)

  def output_hw(self, height: int, width: int) -> tuple[int, int]:
    if self.do_center_crop:
      return self.crop_height, self.crop_width
    if self.pad_size is not None:
      return self.pad_size, self.pad_size
    return self.resized_hw(height, width)


def _resize_axis(x_BxhxwxC: jax.Array, axis: int, size: int, kernel: str, uint8: bool) -> jax.Array:
  """One antialiased pass along `axis`; with `uint8`, of uint8-valued floats rounded and clipped like PIL."""
  if x_BxhxwxC.shape[axis] == size:
    return x_BxhxwxC
  shape = list(x_BxhxwxC.shape)
  shape[axis] = size
  scale = size / x_BxhxwxC.shape[axis]
  y = jax.image.scale_and_translate(x_BxhxwxC, shape, (axis,), jnp.asarray([scale], jnp.float32),
                                    jnp.zeros((1,), jnp.float32), method=kernel, antialias=True)
  if not uint8:
    return y
  # PIL rounds half up when it stores each pass as uint8.
  return jnp.clip(jnp.floor(y + 0.5), 0.0, 255.0)


def center_crop_offsets(height: int, width: int, crop_h: int, crop_w: int, rounding: str = "floor"
                        ) -> tuple[int, int]:
  if crop_h > height or crop_w > width:
    raise ValueError(f"center crop {crop_h}x{crop_w} is larger than the resized {height}x{width} image "
                     "(padding is not supported)")
  offset = CROP_ROUNDING[rounding]
  return offset(height - crop_h), offset(width - crop_w)


def preprocess(images_Bxhxwx3, proc: ImageProcessing) -> jax.Array:
  """uint8 [B, H, W, 3] images -> float32 pixel values [B, crop_h, crop_w, 3] (NHWC) for the vision tower."""
  shape = tuple(images_Bxhxwx3.shape)
  if len(shape) != 4 or shape[-1] != 3:
    raise ValueError(f"images must be [B, H, W, 3], got shape {shape}")
  if np.dtype(images_Bxhxwx3.dtype) != np.uint8:
    raise ValueError(f"images must be uint8, got dtype {images_Bxhxwx3.dtype}")
  x_Bxhxwx3 = jnp.asarray(images_Bxhxwx3).astype(jnp.float32)
  if proc.do_resize:
    new_h, new_w = proc.resized_hw(shape[1], shape[2])
    kernel = RESAMPLE[proc.resample]
    x_Bxhxwx3 = _resize_axis(x_Bxhxwx3, 2, new_w, kernel, proc.uint8_passes)
    x_Bxhxwx3 = _resize_axis(x_Bxhxwx3, 1, new_h, kernel, proc.uint8_passes)
  if proc.pad_size is not None:
    h, w = x_Bxhxwx3.shape[1:3]
    if h > proc.pad_size or w > proc.pad_size:
      raise ValueError(f"pad_size={proc.pad_size} is smaller than the resized {h}x{w} image")
    top, left = (proc.pad_size - h) // 2, (proc.pad_size - w) // 2
    # Zeros before normalising: ResizeMaxSize pads the [0, 1] tensor with fill=0.
    x_Bxhxwx3 = jnp.pad(x_Bxhxwx3, ((0, 0), (top, proc.pad_size - h - top), (left, proc.pad_size - w - left), (0, 0)))
  if proc.do_center_crop:
    h, w = x_Bxhxwx3.shape[1:3]
    top, left = center_crop_offsets(h, w, proc.crop_height, proc.crop_width, proc.crop_rounding)
    x_Bxhxwx3 = x_Bxhxwx3[:, top:top + proc.crop_height, left:left + proc.crop_width]
  if proc.do_rescale:
    x_Bxhxwx3 = x_Bxhxwx3 * jnp.float32(proc.rescale_factor)
  if proc.do_normalize:
    x_Bxhxwx3 = (x_Bxhxwx3 - jnp.asarray(proc.image_mean, jnp.float32)) / jnp.asarray(proc.image_std, jnp.float32)
  return x_Bxhxwx3
