"""GLM-Image VAE: diffusers `AutoencoderKL` in Flax NNX, plus the pipeline's latent normalisation.

Layout of the public API: channels-last everywhere.
- images: [B, H, W, in_channels] float in [-1, 1] (what diffusers' VaeImageProcessor feeds the VAE,
  transposed from NCHW to NHWC);
- latents: [B, H / scale_factor, W / scale_factor, latent_channels].
diffusers' NCHW -> ours: `x.transpose(0, 2, 3, 1)`; ours -> NCHW: `x.transpose(0, 3, 1, 2)`.
`decode` returns the raw decoder output (about [-1, 1], unclamped); the pipeline's postprocessing
maps it to pixels with `(x / 2 + 0.5).clip(0, 1)`.
The latent normalisation helpers take a `channel_axis` so they also apply to NCHW DiT latents.
The decoder runs by bands of rows (`bands`; `VAEConfig.band_rows`) with GroupNorm over whole images: the same
images as diffusers' decode up to rounding, in the memory tiling would save. diffusers' tiling (GroupNorm per
tile, blended seams; off by default, unused by its pipeline) changes the images, so there is no tiled mode here;
the encoder, whose condition images are few, runs whole.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.vae import bands
from glmrl.models.vae.blocks import DownBlock, MidBlock, UpBlock, conv, group_norm
from glmrl.models.vae.config import VAEConfig
from glmrl.sharding import constrain_batch


class LatentDist(NamedTuple):
  """Diagonal Gaussian posterior q(z | x); `logvar` is already clamped to [-30, 20]."""
  mean: jax.Array
  logvar: jax.Array

  @property
  def std(self):
    return jnp.exp(0.5 * self.logvar)

  def mode(self):
    return self.mean

  def sample(self, key):
    return self.mean + self.std * jax.random.normal(key, self.mean.shape, self.mean.dtype)


class Encoder(nnx.Module):
  def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs):
    chans = cfg.block_out_channels
    self.conv_in = conv(cfg, cfg.in_channels, chans[0], 3, rngs=rngs)
    self.down_blocks = nnx.List([
        DownBlock(cfg, chans[max(i - 1, 0)], chans[i], downsample=i < len(chans) - 1, rngs=rngs)
        for i in range(len(chans))])
    self.mid_block = MidBlock(cfg, chans[-1], rngs=rngs)
    self.conv_norm_out = group_norm(cfg, chans[-1], rngs=rngs)
    # Mean and log-variance, concatenated on the channel axis.
    self.conv_out = conv(cfg, chans[-1], 2 * cfg.latent_channels, 3, rngs=rngs)

  def __call__(self, x_BxhxwxC):
    x = self.conv_in(x_BxhxwxC)
    for block in self.down_blocks:
      x = block(x)
    x = self.mid_block(x)
    return self.conv_out(jax.nn.silu(self.conv_norm_out(x)))


class Decoder(nnx.Module):
  """Runs by bands of rows (`bands`: at most `cfg.band_rows` at a time), GroupNorm statistics exact."""

  def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    chans = tuple(reversed(cfg.block_out_channels))
    self.conv_in = conv(cfg, cfg.latent_channels, chans[0], 3, banded=True, rngs=rngs)
    self.mid_block = MidBlock(cfg, chans[0], banded=True, rngs=rngs)
    self.up_blocks = nnx.List([
        UpBlock(cfg, chans[max(i - 1, 0)], chans[i], upsample=i < len(chans) - 1, rngs=rngs)
        for i in range(len(chans))])
    self.conv_norm_out = group_norm(cfg, chans[-1], rngs=rngs)
    self.conv_out = conv(cfg, chans[-1], cfg.out_channels, 3, banded=True, rngs=rngs)

  def __call__(self, z_BxhxwxC):
    max_rows = self.cfg.band_rows
    x = bands.conv_bands(self.conv_in, bands.of_array(constrain_batch(z_BxhxwxC)), max_rows)
    rows = bands.of_array(constrain_batch(self.mid_block(x)))
    for block in self.up_blocks:
      rows = block(rows)
    stats = bands.group_stats(rows, self.cfg.norm_num_groups, max_rows)
    return bands.conv_bands(self.conv_out, rows, max_rows,
                            lambda x, valid: bands.norm_silu(self.conv_norm_out, stats, x, valid))


def _check(x, name: str, channels: int):
  if x.ndim != 4 or x.shape[-1] != channels:
    raise ValueError(f"{name} must be [B, H, W, {channels}] (channels last), got shape {tuple(x.shape)}")


class AutoencoderKL(nnx.Module):
  """Encoder (images -> latent posterior) and decoder (latents -> images), channels last."""

  def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.encoder = Encoder(cfg, rngs=rngs)
    self.decoder = Decoder(cfg, rngs=rngs)
    lat = cfg.latent_channels
    self.quant_conv = conv(cfg, 2 * lat, 2 * lat, 1, rngs=rngs) if cfg.use_quant_conv else None
    self.post_quant_conv = conv(cfg, lat, lat, 1, rngs=rngs) if cfg.use_post_quant_conv else None

  def encode(self, images_BxhxwxC) -> LatentDist:
    _check(images_BxhxwxC, "images", self.cfg.in_channels)
    moments = self.encoder(images_BxhxwxC)
    if self.quant_conv is not None:
      moments = self.quant_conv(moments)
    mean, logvar = jnp.split(moments, 2, axis=-1)
    return LatentDist(mean, jnp.clip(logvar, -30.0, 20.0))

  def decode(self, latents_BxhxwxC):
    _check(latents_BxhxwxC, "latents", self.cfg.latent_channels)
    z = latents_BxhxwxC
    if self.post_quant_conv is not None:
      z = self.post_quant_conv(z)
    return self.decoder(z)

  def encode_normalized(self, images_BxhxwxC, *, key=None):
    """Posterior mode (or a sample when `key` is given), normalised as the pipeline does for
    condition images."""
    dist = self.encode(images_BxhxwxC)
    z = dist.mode() if key is None else dist.sample(key)
    return normalize_latents(z, self.cfg)

  def decode_normalized(self, latents_BxhxwxC):
    """Undo the normalisation of DiT latents, then decode (the pipeline's final step)."""
    return self.decode(denormalize_latents(latents_BxhxwxC, self.cfg))


def _stats(z, cfg: VAEConfig, channel_axis: int):
  if cfg.latents_mean is None or cfg.latents_std is None:
    raise ValueError("the VAE config has no latents_mean / latents_std to normalise with")
  axis = channel_axis % z.ndim
  if z.shape[axis] != cfg.latent_channels:
    raise ValueError(f"latents have {z.shape[axis]} channels on axis {channel_axis}, "
                     f"expected latent_channels={cfg.latent_channels}")
  shape = [1] * z.ndim
  shape[axis] = cfg.latent_channels
  # float32 statistics cast to the latents' dtype, like the pipeline.
  mean = jnp.asarray(cfg.latents_mean, jnp.float32).astype(z.dtype).reshape(shape)
  std = jnp.asarray(cfg.latents_std, jnp.float32).astype(z.dtype).reshape(shape)
  return mean, std


def normalize_latents(z, cfg: VAEConfig, *, channel_axis: int = -1):
  """VAE latents -> DiT latents: `(z - latents_mean) / latents_std` per channel."""
  mean, std = _stats(z, cfg, channel_axis)
  return (z - mean) / std


def denormalize_latents(z, cfg: VAEConfig, *, channel_axis: int = -1):
  """DiT latents -> VAE latents: `z * latents_std + latents_mean` per channel."""
  mean, std = _stats(z, cfg, channel_axis)
  return z * std + mean
