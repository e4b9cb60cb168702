"""Row bands: the VAE decoder computed a band of rows at a time, with GroupNorm's statistics over whole images.

At 1024^2 the decoder's last stages hold [1024, 1024, 512] activations (1 GiB per image in bfloat16): the
upsampled input of a 3x3 conv, its zero-padded copy and its output, three at once. Computed by bands, a conv
reads its band's rows plus one halo row each side (zero outside the image, as its padding would be) and writes
its output rows into a preallocated buffer; an upsample followed by its conv is never materialised at all:
its rows are recomputed from the low-resolution input by whoever reads them (`Rows.fetch`).

GroupNorm stays exact: its mean and variance are over all of an image's rows, taken before any band is
normalised, from the whole activation where it exists (two passes, like torch) or, for a computed one, by
combining per-band means and squared deviations (Chan et al.'s pairwise update). Each band's result equals the
unbanded layer's rows up to rounding (tests/models/vae/test_bands.py).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx


class Rows(NamedTuple):
  """A [B, H, W, C] activation, read by bands of rows.

  `fetch(start, n)` gives rows start .. start + n - 1 (start may be traced and reach outside [0, H)) and
  which of them lie inside the image: x_BxNxWxC (rows outside are arbitrary values) and valid_N.
  `array` is the whole activation when it exists (None when every fetch computes its rows); `source`, the
  array the rows are made from (itself or a computation's input)."""
  shape: tuple[int, int, int, int]
  dtype: jnp.dtype
  fetch: Callable
  array: jax.Array | None
  source: jax.Array

  @property
  def height(self) -> int:
    return self.shape[1]


def zeros(rows: Rows, shape, dtype):
  """Zeros to build a loop's results in. Made like `rows.source`: inside a `shard_map` a loop's carry must
  vary over the same manual mesh axes as the values written into it."""
  return jnp.zeros_like(rows.source, shape=shape, dtype=dtype)


def inside(start, n: int, height: int):
  rows_N = start + jnp.arange(n)
  return (rows_N >= 0) & (rows_N < height)


def zero_outside(x_BxNxWxC, valid_N):
  """`x` with its rows outside the image set to zero (what a conv's zero padding would read there)."""
  return jnp.where(valid_N[None, :, None, None], x_BxNxWxC, 0)


def of_array(x_BxHxWxC) -> Rows:
  height = x_BxHxWxC.shape[1]

  def fetch(start, n: int):
    if isinstance(start, int):  # one band: a static slice, zero rows padded outside the image
      lo, hi = min(max(start, 0), height), max(min(start + n, height), 0)
      pad = [(0, 0), (lo - start, start + n - max(hi, lo))] + [(0, 0)] * 2
      return jnp.pad(x_BxHxWxC[:, lo:max(hi, lo)], pad), inside(start, n, height)
    # A window of min(n, H) real rows, then shifted so that its first row is `start`.
    m = min(n, height)
    base = jnp.clip(start, 0, height - m)
    window = jax.lax.dynamic_slice_in_dim(x_BxHxWxC, base, m, axis=1)
    band = jnp.take(window, start - base + jnp.arange(n), axis=1, mode="fill", fill_value=0)
    return band, inside(start, n, height)

  return Rows(tuple(x_BxHxWxC.shape), x_BxHxWxC.dtype, fetch, x_BxHxWxC, x_BxHxWxC)


def band_rows(height: int, max_rows: int) -> int:
  """Rows per band: the largest divisor of `height` that is at most `max_rows` (bands tile the image)."""
  return max(d for d in range(1, min(height, max_rows) + 1) if height % d == 0)


def _over_bands(count: int, step: Callable, carry):
  """`step(i, carry)` for i < count: a `fori_loop`, or with one band a plain call (Python int 0: static slices,
  less to compile)."""
  return step(0, carry) if count == 1 else jax.lax.fori_loop(0, count, step, carry)


def map_bands(height: int, n: int, body: Callable, buffers: tuple):
  """For each band start = 0, n, 2n, ...: `body(start, buffers)` returns one [B, n, W, C] band per buffer,
  written over the buffer's rows start .. start + n - 1 (in place: the buffers are the loop's carry)."""

  def step(i, buffers):
    start = i * n
    bands = body(start, buffers)
    return tuple(jax.lax.dynamic_update_slice_in_dim(buf, band.astype(buf.dtype), start, axis=1)
                 for buf, band in zip(buffers, bands))

  return _over_bands(height // n, step, tuple(buffers))


def _grouped(x_BxNxWxC, groups: int):
  b, n, w, c = x_BxNxWxC.shape
  return x_BxNxWxC.astype(jnp.float32).reshape(b, n * w, groups, c // groups)


def group_stats(rows: Rows, groups: int, max_rows: int):
  """GroupNorm's float32 mean and (biased) variance per image and group, [B, G] each, over all rows."""
  if rows.array is not None:
    x_BxPxGxc = _grouped(rows.array, groups)
    mean_BxG = jnp.mean(x_BxPxGxc, axis=(1, 3))
    return mean_BxG, jnp.mean(jnp.square(x_BxPxGxc - mean_BxG[:, None, :, None]), axis=(1, 3))
  n = band_rows(rows.height, max_rows)
  b, _, w, c = rows.shape
  per_band = n * w * (c // groups)

  def step(i, carry):
    count, mean_BxG, m2_BxG = carry
    x_BxPxGxc = _grouped(rows.fetch(i * n, n)[0], groups)
    band_mean_BxG = jnp.mean(x_BxPxGxc, axis=(1, 3))
    band_m2_BxG = jnp.sum(jnp.square(x_BxPxGxc - band_mean_BxG[:, None, :, None]), axis=(1, 3))
    total = count + per_band
    delta_BxG = band_mean_BxG - mean_BxG
    return (total, mean_BxG + delta_BxG * (per_band / total),
            m2_BxG + band_m2_BxG + jnp.square(delta_BxG) * (count * per_band / total))

  zeros_BxG = zeros(rows, (b, groups), jnp.float32)
  _, mean_BxG, m2_BxG = _over_bands(rows.height // n, step, (jnp.float32(0), zeros_BxG, zeros_BxG))
  return mean_BxG, m2_BxG / (rows.height * w * (c // groups))


def norm_silu(norm: nnx.GroupNorm, stats, x_BxNxWxC, valid_N):
  """silu(GroupNorm(x)) of a band with the whole image's `stats`, zero on rows outside the image (the
  following conv's padding)."""
  mean_BxG, var_BxG = stats
  b, n, w, c = x_BxNxWxC.shape
  groups = mean_BxG.shape[1]
  x_BxPxGxc = _grouped(x_BxNxWxC, groups)
  y_BxPxGxc = (x_BxPxGxc - mean_BxG[:, None, :, None]) * jax.lax.rsqrt(var_BxG + norm.epsilon)[:, None, :, None]
  y_BxNxWxC = y_BxPxGxc.reshape(b, n, w, c) * norm.scale[...] + norm.bias[...]
  return zero_outside(jax.nn.silu(y_BxNxWxC.astype(norm.dtype or x_BxNxWxC.dtype)), valid_N)


def conv_bands(conv: nnx.Conv, rows: Rows, max_rows: int, activation=None):
  """A 3x3 conv (built with no row padding) over all rows, by bands: each band reads one halo row each side.
  `activation(x_band, valid_N)` is applied to its input rows first (default: zero outside the image)."""
  activation = activation or zero_outside
  n = band_rows(rows.height, max_rows)
  b, h, w, _ = rows.shape

  def body(start, _):
    return (conv(activation(*rows.fetch(start - 1, n + 2))),)

  out = zeros(rows, (b, h, w, conv.out_features), conv.dtype or rows.dtype)
  return map_bands(h, n, body, (out,))[0]
