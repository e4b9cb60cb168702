"""Image grids with captions rendered under each tile (PIL)."""

import functools
import math
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

_BACKGROUND = (255, 255, 255)
_TEXT = (0, 0, 0)
_MARGIN = 2  # pixels between a tile's caption text and its edges


@functools.lru_cache(maxsize=8)
def get_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
  """Pillow's bundled font (no system fonts needed)."""
  return ImageFont.load_default(size=size)


def line_height(font) -> int:
  ascent, descent = font.getmetrics()
  return ascent + descent + 1


def _widest_prefix(text: str, font, max_width: int) -> int:
  """Length of the longest prefix of `text` within `max_width` pixels (at least 1), by bisection."""
  lo, hi = 1, len(text)
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if font.getlength(text[:mid]) <= max_width:
      lo = mid
    else:
      hi = mid - 1
  return lo


def wrap_text(text: str, font, max_width: int, max_lines: int) -> list[str]:
  """Greedy word wrap to `max_width` pixels; overflow is cut and marked with '...'.

  Linear in what is shown, whatever the caption's length: a glyph is at least a pixel wide, so no more than
  (max_lines + 1) x max_width characters can reach the lines kept, and wrapping stops past them."""
  text = text[:(max_lines + 1) * max(int(max_width), 1)]
  lines: list[str] = []
  current = ""
  for word in text.split():
    if len(lines) > max_lines:
      break
    candidate = f"{current} {word}" if current else word
    if font.getlength(candidate) <= max_width:
      current = candidate
      continue
    if current:
      lines.append(current)
    current = word
    while len(current) > 1 and len(lines) <= max_lines and font.getlength(current) > max_width:
      cut = _widest_prefix(current, font, max_width)  # a word wider than the tile
      lines.append(current[:cut])
      current = current[cut:]
  if current:
    lines.append(current)
  if len(lines) > max_lines:
    last = lines[max_lines - 1]
    while last and font.getlength(last + "...") > max_width:
      last = last[:-1]
    lines = lines[:max_lines - 1] + [last + "..."]
  return lines


def make_grid(images_uint8, captions: Sequence[str] | None = None, ncols: int | None = None, *,
              pad: int = 4, min_tile_width: int = 128, caption_lines: int = 3,
              font_size: int = 12) -> np.ndarray:
  """Tiles N images uint8 [N, H, W, 3] into one uint8 image, each with its caption below.

  Tiles are upscaled (nearest) by the integer factor s = ceil(min_tile_width / W)
  (at least 1) so captions stay legible on tiny samples. With nrows = ceil(N / ncols)
  the result is [nrows * (s*H + band) + (nrows + 1) * pad, ncols * s*W + (ncols + 1) * pad, 3],
  where band = caption_lines * line_height + 2 * margin, or 0 without captions.
  `ncols` defaults to ceil(sqrt(N)).
  """
  images = np.asarray(images_uint8)
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8 or images.shape[0] == 0:
    raise ValueError(f"images must be uint8 [N>0, H, W, 3], got {images.dtype} {images.shape}")
  n, h, w, _ = images.shape
  if captions is not None:
    if isinstance(captions, str) or len(captions) != n:
      raise ValueError(f"captions must be a list of {n} strings, got {captions!r}")
  if ncols is None:
    ncols = math.ceil(math.sqrt(n))
  if isinstance(ncols, bool) or not isinstance(ncols, (int, np.integer)) or ncols <= 0:
    raise ValueError(f"ncols={ncols!r} must be a positive integer")
  for name, value in (("pad", pad), ("min_tile_width", min_tile_width), ("caption_lines", caption_lines),
                      ("font_size", font_size)):
    if not isinstance(value, (int, np.integer)) or value < (0 if name in ("pad", "min_tile_width") else 1):
      raise ValueError(f"{name}={value!r} is out of range")
  ncols = min(int(ncols), n)
  nrows = math.ceil(n / ncols)
  scale = max(1, math.ceil(min_tile_width / w))
  tile_h, tile_w = h * scale, w * scale
  font = get_font(font_size)
  band = caption_lines * line_height(font) + 2 * _MARGIN if captions is not None else 0

  grid = Image.new("RGB", (ncols * tile_w + (ncols + 1) * pad, nrows * (tile_h + band) + (nrows + 1) * pad),
                   _BACKGROUND)
  draw = ImageDraw.Draw(grid)
  for i in range(n):
    row, col = divmod(i, ncols)
    x = pad + col * (tile_w + pad)
    y = pad + row * (tile_h + band + pad)
    tile = np.repeat(np.repeat(images[i], scale, axis=0), scale, axis=1)
    grid.paste(Image.fromarray(tile), (x, y))
    if captions is not None:
      lines = wrap_text(str(captions[i]), font, tile_w - 2 * _MARGIN, caption_lines)
      for k, text in enumerate(lines):
        draw.text((x + _MARGIN, y + tile_h + _MARGIN + k * line_height(font)), text, fill=_TEXT, font=font)
  return np.asarray(grid, dtype=np.uint8)
