"""The decoder by bands of rows: equal to diffusers' decode and to one band, GroupNorm statistics exact, and the
memory it exists for.

Tolerances: 1e-4 max abs against diffusers (float32, as test_model.py); 1e-5 between band sizes; 1e-6 relative
for the statistics against float64.
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from checkpoints_convert.maps.vae import RULES
from glmrl.models.vae import AutoencoderKL, VAEConfig, bands
from glmrl.models.vae.blocks import ResnetBlock, Upsample
from tests import torch_port
from tests.models.vae.test_model import nchw, nhwc, torch_model


def _ours(cfg, ref):
  model = nnx.eval_shape(lambda: AutoencoderKL(cfg, rngs=nnx.Rngs(0)))
  torch_port.load_state_dict(model, ref.state_dict(), RULES)
  return model


@pytest.mark.parametrize("height", [7, 8])
def test_decode_by_bands_matches_diffusers(height):
  import torch

  # Height 7: bands of one row (band_rows 2 and 3 have no divisor but 1) and of the whole 7 / 14 rows.
  cfg = VAEConfig.tiny()
  torch.manual_seed(0)
  ref = torch_model(cfg)
  with torch.no_grad():
    for name, p in ref.named_parameters():
      if "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  z = torch.from_numpy(np.random.default_rng(1).standard_normal((2, 4, height, 5)).astype(np.float32) + 0.5)
  with torch.no_grad():
    want = ref.decode(z, return_dict=False)[0].numpy()
  decode = nnx.jit(lambda m, z: m.decode(z))
  whole = None
  for band_rows in (64, 4, 2, 1):
    got = np.asarray(decode(_ours(dataclasses.replace(cfg, band_rows=band_rows), ref), nhwc(z)))
    np.testing.assert_allclose(nchw(got), want, rtol=0, atol=1e-4)
    whole = got if whole is None else whole
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-5)


def test_group_stats_computed_rows_equal_float64():
  # A large mean: the statistics must not be E[x^2] - E[x]^2.
  x = np.random.default_rng(0).standard_normal((2, 12, 5, 8)).astype(np.float32) * 0.1 + 30.0
  whole = bands.of_array(jnp.asarray(x))
  computed = whole._replace(array=None)  # read only by bands, as an upsample's rows are
  g = x.astype(np.float64).reshape(2, 12 * 5, 4, 2)
  mean, var = g.mean(axis=(1, 3)), g.var(axis=(1, 3))
  for rows, max_rows in ((whole, 12), (computed, 4), (computed, 1)):
    got_mean, got_var = bands.group_stats(rows, 4, max_rows)
    np.testing.assert_allclose(np.asarray(got_mean), mean, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got_var), var, rtol=1e-4)  # of 1e-2: float32 rounding of x - mean


def test_upsample_rows_anywhere():
  """Any window of the banded upsample's rows, reaching outside the image or not, from either parity, is the
  whole upsample-and-conv's rows; its `valid` says which rows lie inside. (In two bands: computed when read.)"""
  cfg = VAEConfig.tiny(band_rows=5)
  banded = Upsample(cfg, 4, banded=True, rngs=nnx.Rngs(0))
  whole = Upsample(cfg, 4, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(2).standard_normal((1, 5, 3, 4)).astype(np.float32))
  want = np.asarray(whole(x))
  rows = banded(x)
  assert rows.shape == (1, 10, 6, 4) and rows.array is None
  for start in (-2, -1, 0, 1, 3, 8, 9):
    got, valid = jax.jit(rows.fetch, static_argnums=1)(start, 4)
    inside = [0 <= r < 10 for r in range(start, start + 4)]
    np.testing.assert_array_equal(np.asarray(valid), inside)
    np.testing.assert_allclose(np.asarray(got)[:, np.asarray(inside)],
                               want[:, max(start, 0):start + 4], rtol=0, atol=1e-6)


def test_bands_shrink_the_temporaries():
  """What bands are for: an upsample and the resnet after it (as at the decoder's last level) never hold the
  upsampled activation, only the resnet's two outputs (XLA:CPU's buffer assignment). Whole, they held it, its
  conv's padded copy and the conv's output."""
  cfg = VAEConfig.tiny(norm_num_groups=8)
  x = jax.ShapeDtypeStruct((1, 64, 64, 32), jnp.float32)

  def temporaries(band_rows, banded):
    cfg_b = dataclasses.replace(cfg, band_rows=band_rows)
    up = nnx.eval_shape(lambda: Upsample(cfg_b, 32, banded=banded, rngs=nnx.Rngs(0)))
    resnet = nnx.eval_shape(lambda: ResnetBlock(cfg_b, 32, 8, banded=banded, rngs=nnx.Rngs(0)))
    graph, state = nnx.split((up, resnet))
    block = jax.jit(lambda state, x: (lambda up, resnet: resnet(up(x)))(*nnx.merge(graph, state)))
    return block.lower(state, x).compile().memory_analysis().temp_size_in_bytes

  upsampled = 128 * 128 * 32 * 4  # float32
  outputs = 2 * 128 * 128 * 8 * 4  # the resnet's conv1 output and shortcut
  assert temporaries(128, banded=False) >= 3 * upsampled
  assert temporaries(8, banded=True) < outputs + upsampled / 4
