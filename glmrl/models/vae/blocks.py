"""Building blocks of the AutoencoderKL encoder/decoder (NHWC activations, HWIO kernels).

The decoder's blocks are built `banded` (`bands`): their 3x3 convs pad columns only, and they run a band of
rows at a time; the encoder's run whole.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.vae import bands
from glmrl.models.vae.config import VAEConfig
from glmrl.sharding import CONV_IN, CONV_OUT

# diffusers builds every VAE GroupNorm with this epsilon, whatever the config says.
_EPS = 1e-6


def conv(cfg: VAEConfig, cin: int, cout: int, k: int, *, stride: int = 1, padding=None, banded: bool = False,
         rngs: nnx.Rngs) -> nnx.Conv:
  """`banded`: no row padding (`bands.conv_bands` feeds it halo rows, zero outside the image)."""
  if padding is None:
    padding = ((0 if banded else k // 2,) * 2, (k // 2, k // 2))
  return nnx.Conv(cin, cout, (k, k), strides=stride, padding=padding, dtype=cfg.dtype,
                  param_dtype=cfg.param_dtype, rngs=rngs,
                  kernel_metadata={"out_sharding": (None, None, CONV_IN, CONV_OUT)},
                  bias_metadata={"out_sharding": (CONV_OUT,)})


def group_norm(cfg: VAEConfig, channels: int, *, rngs: nnx.Rngs) -> nnx.GroupNorm:
  # Two-pass variance, like torch.nn.GroupNorm; the fast E[x^2]-E[x]^2 form loses precision
  # on activations with a large mean.
  return nnx.GroupNorm(channels, num_groups=cfg.norm_num_groups, epsilon=_EPS, dtype=cfg.dtype,
                       param_dtype=cfg.param_dtype, use_fast_variance=False, rngs=rngs,
                       scale_metadata={"out_sharding": (CONV_OUT,)},
                       bias_metadata={"out_sharding": (CONV_OUT,)})


class ResnetBlock(nnx.Module):
  """GroupNorm-SiLU-Conv twice with a residual (1x1 conv when the width changes).

  `banded`: takes its input as `bands.Rows` (or an array) and runs by bands, in two passes (each after its
  GroupNorm's statistics): conv1 with the shortcut, then conv2 added to the shortcut in place."""

  def __init__(self, cfg: VAEConfig, cin: int, cout: int, *, banded: bool = False, rngs: nnx.Rngs):
    self.cfg, self.banded = cfg, banded
    self.norm1 = group_norm(cfg, cin, rngs=rngs)
    self.conv1 = conv(cfg, cin, cout, 3, banded=banded, rngs=rngs)
    self.norm2 = group_norm(cfg, cout, rngs=rngs)
    self.conv2 = conv(cfg, cout, cout, 3, banded=banded, rngs=rngs)
    self.conv_shortcut = conv(cfg, cin, cout, 1, rngs=rngs) if cin != cout else None

  def __call__(self, x_BxhxwxC):
    if self.banded:
      return self._by_bands(x_BxhxwxC if isinstance(x_BxhxwxC, bands.Rows) else bands.of_array(x_BxhxwxC))
    h = self.conv1(jax.nn.silu(self.norm1(x_BxhxwxC)))
    h = self.conv2(jax.nn.silu(self.norm2(h)))
    skip = x_BxhxwxC if self.conv_shortcut is None else self.conv_shortcut(x_BxhxwxC)
    return skip + h

  def _by_bands(self, rows: bands.Rows):
    max_rows, groups = self.cfg.band_rows, self.cfg.norm_num_groups
    b, height, w, _ = rows.shape
    n = bands.band_rows(height, max_rows)
    stats1 = bands.group_stats(rows, groups, max_rows)

    def first(start, _):
      x_BxNxWxC, valid_N = rows.fetch(start - 1, n + 2)
      h = self.conv1(bands.norm_silu(self.norm1, stats1, x_BxNxWxC, valid_N))
      core = x_BxNxWxC[:, 1:-1]
      return h, core if self.conv_shortcut is None else self.conv_shortcut(core)

    dtype = self.conv1.dtype or rows.dtype
    empty = bands.zeros(rows, (b, height, w, self.conv1.out_features), dtype)
    h, skip = bands.map_bands(height, n, first, (empty, empty))
    h_rows = bands.of_array(h)
    stats2 = bands.group_stats(h_rows, groups, max_rows)

    def second(start, buffers):
      h_BxNxWxC = self.conv2(bands.norm_silu(self.norm2, stats2, *h_rows.fetch(start - 1, n + 2)))
      return (jax.lax.dynamic_slice_in_dim(buffers[0], start, n, axis=1) + h_BxNxWxC,)

    return bands.map_bands(height, n, second, (skip,))[0]


class Downsample(nnx.Module):
  """Stride-2 3x3 conv after zero-padding one row/column at the bottom/right only."""

  def __init__(self, cfg: VAEConfig, channels: int, *, rngs: nnx.Rngs):
    self.conv = conv(cfg, channels, channels, 3, stride=2, padding=((0, 1), (0, 1)), rngs=rngs)

  def __call__(self, x_BxhxwxC):
    return self.conv(x_BxhxwxC)


def _upsample(x_BxhxwxC):
  return jnp.repeat(jnp.repeat(x_BxhxwxC, 2, axis=1), 2, axis=2)


class Upsample(nnx.Module):
  """Nearest-neighbour 2x upsampling followed by a 3x3 conv.

  Banded (the decoder's): returns `bands.Rows` that compute each band from the input's rows when read, so
  the upsampled activation and the conv's output never exist whole (each read recomputes its rows: the
  following GroupNorm's statistics and its conv read them twice). When one band is the whole output, it is
  computed once and kept."""

  def __init__(self, cfg: VAEConfig, channels: int, *, banded: bool = False, rngs: nnx.Rngs):
    self.cfg, self.banded = cfg, banded
    self.conv = conv(cfg, channels, channels, 3, banded=banded, rngs=rngs)

  def __call__(self, x_BxhxwxC):
    if not self.banded:
      return self.conv(_upsample(x_BxhxwxC))
    low = bands.of_array(x_BxhxwxC)
    b, h, w, c = x_BxhxwxC.shape

    def fetch(start, n: int):
      # Output rows start .. start + n - 1 read upsampled rows start - 1 .. start + n, which repeat input rows
      # floor((start - 1) / 2) on; n // 2 + 2 of them cover that window whichever parity start has.
      first = (start - 1) // 2  # floor division, of a Python int (one band) or a traced one
      x_BxMxwxC, valid_M = low.fetch(first, n // 2 + 2)
      up_Bx2Mx2wxC = bands.zero_outside(_upsample(x_BxMxwxC), jnp.repeat(valid_M, 2))
      window = jax.lax.dynamic_slice_in_dim(up_Bx2Mx2wxC, start - 1 - 2 * first, n + 2, axis=1)
      return self.conv(window), bands.inside(start, n, 2 * h)

    if bands.band_rows(2 * h, self.cfg.band_rows) == 2 * h:
      return bands.of_array(fetch(0, 2 * h)[0])
    return bands.Rows((b, 2 * h, 2 * w, self.conv.out_features), self.conv.dtype or x_BxhxwxC.dtype, fetch, None,
                      x_BxhxwxC)


class SpatialAttention(nnx.Module):
  """Single-head self-attention over all H*W positions with a residual (the mid block's)."""

  def __init__(self, cfg: VAEConfig, channels: int, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.group_norm = group_norm(cfg, channels, rngs=rngs)

    def linear():
      return nnx.Linear(channels, channels, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                        kernel_metadata={"out_sharding": (CONV_IN, CONV_OUT)},
                        bias_metadata={"out_sharding": (CONV_OUT,)})

    self.to_q, self.to_k, self.to_v, self.to_out = linear(), linear(), linear(), linear()

  def __call__(self, x_BxhxwxC):
    b, h, w, c = x_BxhxwxC.shape
    t_BxTxC = self.group_norm(x_BxhxwxC).reshape(b, h * w, c)
    q_BxLxC, k_BxTxC, v_BxTxC = self.to_q(t_BxTxC), self.to_k(t_BxTxC), self.to_v(t_BxTxC)
    logits_BxLxT = jnp.einsum("btc,bsc->bts", q_BxLxC, k_BxTxC,
                              preferred_element_type=jnp.float32) * (c ** -0.5)
    # Softmax in float32 (the reference upcasts the softmax of this block).
    probs_BxLxT = jax.nn.softmax(logits_BxLxT, axis=-1).astype(v_BxTxC.dtype)
    o_BxLxC = jnp.einsum("bts,bsc->btc", probs_BxLxT, v_BxTxC)
    return x_BxhxwxC + self.to_out(o_BxLxC).reshape(b, h, w, c)


class MidBlock(nnx.Module):
  """ResnetBlock, [SpatialAttention], ResnetBlock at the bottleneck width (`banded`: the resnets')."""

  def __init__(self, cfg: VAEConfig, channels: int, *, banded: bool = False, rngs: nnx.Rngs):
    self.resnets = nnx.List([ResnetBlock(cfg, channels, channels, banded=banded, rngs=rngs) for _ in range(2)])
    self.attention = SpatialAttention(cfg, channels, rngs=rngs) if cfg.mid_block_add_attention else None

  def __call__(self, x_BxhxwxC):
    x = self.resnets[0](x_BxhxwxC)
    if self.attention is not None:
      x = self.attention(x)
    return self.resnets[1](x)


class DownBlock(nnx.Module):
  def __init__(self, cfg: VAEConfig, cin: int, cout: int, *, downsample: bool, rngs: nnx.Rngs):
    self.resnets = nnx.List([ResnetBlock(cfg, cin if j == 0 else cout, cout, rngs=rngs)
                             for j in range(cfg.layers_per_block)])
    self.downsample = Downsample(cfg, cout, rngs=rngs) if downsample else None

  def __call__(self, x_BxhxwxC):
    for resnet in self.resnets:
      x_BxhxwxC = resnet(x_BxhxwxC)
    return x_BxhxwxC if self.downsample is None else self.downsample(x_BxhxwxC)


class UpBlock(nnx.Module):
  """The decoder's: banded resnets, then the upsample's `bands.Rows` (or the last resnet's output)."""

  def __init__(self, cfg: VAEConfig, cin: int, cout: int, *, upsample: bool, rngs: nnx.Rngs):
    # The decoder has one more resnet per level than the encoder.
    self.resnets = nnx.List([ResnetBlock(cfg, cin if j == 0 else cout, cout, banded=True, rngs=rngs)
                             for j in range(cfg.layers_per_block + 1)])
    self.upsample = Upsample(cfg, cout, banded=True, rngs=rngs) if upsample else None

  def __call__(self, x: bands.Rows | jax.Array) -> bands.Rows:
    for resnet in self.resnets:
      x = resnet(x)
    return bands.of_array(x) if self.upsample is None else self.upsample(x)
