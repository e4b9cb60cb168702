"""Vision encoder + VQ parity with transformers' GlmImage vision model and get_image_tokens.

Tolerances: position-table resampling 1e-6 and encoder features 1e-4 max abs (float32);
codebook ids exactly equal.
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import nnx
from transformers import GlmImageConfig, GlmImageForConditionalGeneration

from checkpoints_convert.maps.ar import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.model import GlmImageAR
from glmrl.models.ar.vision import pos_embed_taps

ATOL_TAPS = 1e-6
ATOL_FEATURES = 1e-4
CFG = ARConfig.tiny()
# (1, h, w) grids: non-square, square, and wider than the 8x8 position table (border clamp).
GRIDS = np.array([[1, 3, 5], [1, 4, 4], [1, 2, 10]])


@pytest.fixture(scope="module")
def models():
  torch.manual_seed(0)
  ref = GlmImageForConditionalGeneration(GlmImageConfig(**CFG.to_hf())).eval()
  ref.config._attn_implementation = "eager"
  with torch.no_grad():  # larger than the init so the position table and codebook matter
    for name, p in ref.named_parameters():
      is_norm_scale = "norm" in name.split(".")[-2] and name.endswith("weight")
      p.copy_(1 + 0.1 * torch.randn_like(p) if is_norm_scale else 0.1 * torch.randn_like(p))
  ours = nnx.eval_shape(lambda: GlmImageAR(CFG, rngs=nnx.Rngs(0)))
  keymap = KeyMap(RULES)
  params = {flax_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(ours, nnx.Param))}
  for key, tensor in ref.state_dict().items():
    path, transform = keymap.hf_to_flax(key)
    params[path].set_value(jnp.asarray(transform.to_flax(tensor.numpy())))
  return ref, ours


def pixels_for(grids, seed=0):
  n = int(sum(h * w for _, h, w in grids))
  return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, CFG.vision.patch_dim)).astype(np.float32))


@pytest.mark.parametrize("h,w,grid", [(3, 5, 8), (2, 10, 8), (8, 8, 8), (1, 1, 8), (16, 3, 8), (5, 7, 128)])
def test_pos_embed_taps_match_grid_sample(h, w, grid):
  table = torch.randn(grid * grid, 6)
  hc = torch.arange(h).repeat_interleave(w)
  wc = torch.arange(w).repeat(h)
  xy = torch.stack((((wc + 0.5) / w) * 2 - 1, ((hc + 0.5) / h) * 2 - 1), -1)[None, :, None]
  image = table.view(grid, grid, -1).permute(2, 0, 1)[None]
  want = F.grid_sample(image, xy, mode="bilinear", align_corners=False, padding_mode="border")[0, :, :, 0].T
  rows, wts = pos_embed_taps(h, w, grid)
  got = np.einsum("nk,nke->ne", wts, table.numpy()[rows])
  np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=ATOL_TAPS)


def test_encoder_features_match_reference(models):
  ref, ours = models
  pixels = pixels_for(GRIDS)
  with torch.no_grad():
    want = ref.model.visual(pixels, grid_thw=torch.tensor(GRIDS)).last_hidden_state.numpy()
  encode = nnx.jit(lambda m, x, h, w: m.visual(x, h, w), static_argnums=(2, 3))
  offset = 0
  for _, h, w in GRIDS[:2]:
    got = np.asarray(encode(ours, jnp.asarray(pixels.numpy()[offset:offset + h * w]), int(h), int(w)))
    np.testing.assert_allclose(got, want[offset:offset + h * w], rtol=0, atol=ATOL_FEATURES)
    offset += h * w


def test_image_tokens_match_reference(models):
  ref, ours = models
  pixels = pixels_for(GRIDS, seed=1)
  with torch.no_grad():
    feats = ref.model.get_image_features(pixels, torch.tensor(GRIDS)).pooler_output
    want = ref.model.get_image_tokens(feats).numpy()
  got = np.asarray(ours.image_tokens(pixels.numpy(), GRIDS))
  assert got.dtype == np.int32 and got.shape == (int(np.prod(GRIDS[:, 1:], axis=1).sum()),)
  np.testing.assert_array_equal(got, want)
  assert len(np.unique(got)) > 8  # the comparison is not vacuous (many distinct codes)
