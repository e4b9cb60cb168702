import glmrl  # noqa: F401
import numpy as np
import pytest

from glmrl.logging import make_grid
from glmrl.logging.images import get_font, line_height, wrap_text


@pytest.fixture(scope="module")
def images():
  return np.random.default_rng(0).integers(0, 256, (5, 32, 48, 3), dtype=np.uint8)


def test_shape_and_tile_placement_without_captions(images):
  grid = make_grid(images, None, 3, pad=4, min_tile_width=96)
  scale = 2  # ceil(96 / 48)
  th, tw = 32 * scale, 48 * scale
  assert grid.dtype == np.uint8 and grid.shape == (2 * th + 3 * 4, 3 * tw + 4 * 4, 3)
  for i in range(5):
    r, c = divmod(i, 3)
    y, x = 4 + r * (th + 4), 4 + c * (tw + 4)
    np.testing.assert_array_equal(grid[y:y + th, x:x + tw], images[i].repeat(2, 0).repeat(2, 1))
  assert np.all(grid[4 + th + 4:, 4 + 2 * (tw + 4):] == 255)  # the empty sixth cell stays background


def test_captions_are_rendered_in_their_band(images):
  band = 3 * line_height(get_font(12)) + 4
  captions = [f"0.{i}12 | a prompt number {i}" for i in range(5)]
  grid = make_grid(images, captions, 5, pad=2, min_tile_width=0)
  assert grid.shape == (32 + band + 4, 5 * 48 + 6 * 2, 3)
  blank = make_grid(images, [""] * 5, 5, pad=2, min_tile_width=0)
  assert blank.shape == grid.shape
  for i in range(5):
    x = 2 + i * 50
    text_region = grid[2 + 32:2 + 32 + band, x:x + 48]
    assert (text_region.min(axis=-1) < 128).sum() > 20, f"no dark text pixels under tile {i}"
    assert np.all(blank[2 + 32:2 + 32 + band, x:x + 48] == 255)
  # Different captions render differently.
  assert not np.array_equal(grid[34:34 + band, 2:50], grid[34:34 + band, 52:100])


def test_default_ncols_and_upscaling():
  imgs = np.zeros((4, 32, 32, 3), np.uint8)
  grid = make_grid(imgs)  # ncols = 2, scale = ceil(128 / 32) = 4
  assert grid.shape == (2 * 128 + 3 * 4, 2 * 128 + 3 * 4, 3)


def test_wrap_text_wraps_and_truncates():
  font = get_font(12)
  lines = wrap_text("word " * 40 + "averyveryverylongunbreakableword", font, 60, 3)
  assert len(lines) == 3 and lines[-1].endswith("...")
  assert all(font.getlength(line) <= 60 for line in lines)
  long_word = wrap_text("x" * 50, font, 40, 10)
  assert "".join(long_word) == "x" * 50 and all(font.getlength(line) <= 40 for line in long_word)


@pytest.mark.parametrize("imgs,captions,ncols,match", [
    (np.zeros((2, 8, 8, 3), np.float32), None, None, "images must be uint8"),
    (np.zeros((0, 8, 8, 3), np.uint8), None, None, "N>0"),
    (np.zeros((2, 8, 8, 3), np.uint8), ["one"], None, "captions must be a list of 2 strings"),
    (np.zeros((2, 8, 8, 3), np.uint8), None, 0, "ncols=0"),
])
def test_errors(imgs, captions, ncols, match):
  with pytest.raises(ValueError, match=match):
    make_grid(imgs, captions, ncols)


def test_wrap_text_takes_no_longer_for_a_huge_caption():
  """Linear in what is shown: a 1,000-character word and a 100,000-character prompt wrap in milliseconds
  (the quadratic cut search took 114 s for the first at the demo's tile width)."""
  import time

  font = get_font(12)
  for caption in ("x" * 1000, "a cat " * 16_000 + "y" * 100_000):
    start = time.perf_counter()
    lines = wrap_text(caption, font, 124, 3)
    assert time.perf_counter() - start < 0.5
    assert len(lines) == 3 and lines[-1].endswith("...")
    assert all(font.getlength(line) <= 124 for line in lines)
