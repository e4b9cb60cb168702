"""GlmImageDiT vs diffusers GlmImageTransformer2DModel (float32, tiny random config)."""

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from glmrl.models.dit import DiTConfig
from tests.models.dit import torch_ref

TOL = 1e-4  # max abs, float32
FULL_PARAMS = 6_926_882_880


@pytest.fixture(scope="module")
def inputs(tiny_cfg):
  # Non-square latents so that a transposed patch grid or RoPE axis would show.
  return torch_ref.t2i_inputs(tiny_cfg, seed=1, batch=2, height=8, width=12, text_len=5)


@pytest.mark.parametrize("drop", [False, True])
def test_text_to_image_matches_reference(model, ref_model, inputs, drop):
  ids = inputs["prior_token_ids"]
  want = torch_ref.ref_forward(ref_model, **inputs, prior_token_drop=np.full(ids.shape, drop))
  got = torch_ref.forward(model, inputs, prior_token_drop=drop)
  assert got.shape == want.shape == inputs["latents"].shape
  assert torch_ref.max_abs(got, want) < TOL


def test_per_sample_and_per_token_drop(model, ref_model, inputs):
  ids = inputs["prior_token_ids"]
  per_token = np.random.default_rng(2).random(ids.shape) < 0.5
  per_token[1] = True  # row 1: the unconditional branch, as a [B, 1] mask expresses it
  got_tokens = torch_ref.forward(model, inputs, prior_token_drop=per_token)
  want = torch_ref.ref_forward(ref_model, **inputs, prior_token_drop=per_token)
  assert torch_ref.max_abs(got_tokens, want) < TOL
  per_sample = np.array([[False], [True]])
  want = torch_ref.ref_forward(ref_model, **inputs, prior_token_drop=np.broadcast_to(per_sample, ids.shape).copy())
  got_rows = torch_ref.forward(model, inputs, prior_token_drop=per_sample)
  assert torch_ref.max_abs(got_rows, want) < TOL


def test_glyph_mask_hides_padding(model, ref_model, inputs):
  """Left-padded glyph tokens under glyph_mask=False change nothing (not a reference feature:
  the oracle is the reference on the unpadded batch)."""
  want = torch_ref.ref_forward(ref_model, **inputs, prior_token_drop=np.zeros(inputs["prior_token_ids"].shape, bool))
  pad = 3
  padded = dict(inputs)
  noise = np.random.default_rng(3).standard_normal((2, pad, inputs["glyph_embeds"].shape[-1])).astype(np.float32)
  padded["glyph_embeds"] = np.concatenate([noise, inputs["glyph_embeds"]], axis=1)
  mask = np.concatenate([np.zeros((2, pad), bool), np.ones((2, inputs["glyph_embeds"].shape[1]), bool)], axis=1)
  got = torch_ref.forward(model, padded, glyph_mask=mask)
  assert torch_ref.max_abs(got, want) < TOL


def test_bfloat16_compute_runs(ref_model, model, inputs):
  bf16 = torch_ref.ported(ref_model, DiTConfig.tiny(dtype=jnp.bfloat16))
  got = torch_ref.forward(bf16, inputs)
  assert got.dtype == jnp.bfloat16
  got = np.asarray(got, np.float32)
  want = np.asarray(torch_ref.forward(model, inputs))
  # A sanity bound only: bf16 keeps 8 mantissa bits.
  assert np.isfinite(got).all()
  assert torch_ref.max_abs(got, want) < 0.1 * np.abs(want).max()


def _primitive_names(jaxpr, acc):
  for eqn in jaxpr.eqns:
    acc.append(eqn.primitive.name)
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", None)
      if inner is not None:
        _primitive_names(getattr(inner, "jaxpr", inner), acc)
  return acc


@pytest.mark.parametrize("remat", [False, True])
def test_remat_wraps_each_block(tiny_cfg, inputs, remat):
  """Structural (tracing only, no compile): with remat every block's backward recomputes it."""
  m = torch_ref.abstract_model(DiTConfig.tiny(remat=remat))
  graphdef = nnx.graphdef(m)

  def grad_fn(state):
    return nnx.grad(lambda mm: jnp.mean(jnp.square(mm(**inputs))))(nnx.merge(graphdef, state))

  names = _primitive_names(jax.make_jaxpr(grad_fn)(nnx.state(m)).jaxpr, [])
  assert names.count("remat2") == (tiny_cfg.num_layers if remat else 0)


def test_full_size_parameter_count(full_flax_shapes, full_ref_meta):
  assert sum(int(np.prod(shape)) for shape in full_flax_shapes.values()) == FULL_PARAMS
  assert sum(p.numel() for p in full_ref_meta.parameters()) == FULL_PARAMS


def test_full_size_forward_shapes(full_abstract_model):
  """A 1024x1024 image (128x128 latents) with 300 glyph tokens: write a source cache, read it."""
  sds = jax.ShapeDtypeStruct
  args = (sds((1, 16, 128, 128), jnp.float32), sds((1, 64 * 64), jnp.int32), sds((1, 300, 1472), jnp.float32),
          sds((1,), jnp.float32), sds((1, 2), jnp.float32), sds((1, 2), jnp.float32))
  out, cache = nnx.eval_shape(lambda m, *a: m(*a, cache_mode="write"), full_abstract_model, *args)
  assert out.shape == (1, 16, 128, 128)
  assert cache.k.shape == cache.v.shape == (30, 1, 300 + 4096, 32, 128)
  out, _ = nnx.eval_shape(lambda m, c, *a: m(*a, kv_cache=c, cache_mode="read"), full_abstract_model, cache, *args)
  assert out.shape == (1, 16, 128, 128)


@pytest.mark.parametrize("change, match", [
    (dict(latents=np.zeros((2, 3, 8, 12), np.float32)), "latents shape"),
    (dict(latents=np.zeros((2, 4, 7, 12), np.float32)), "multiples of patch_size"),
    (dict(prior_token_ids=np.zeros((2, 5), np.int32)), "prior_token_ids shape"),
    (dict(prior_token_ids=np.zeros((2, 24), np.float32)), "must be integers"),
    (dict(glyph_embeds=np.zeros((2, 5, 7), np.float32)), "glyph_embeds shape"),
    (dict(timestep=np.zeros((3,), np.float32)), "timestep shape"),
    (dict(target_size=np.zeros((2, 3), np.float32)), "target_size shape"),
    (dict(crop_coords=np.zeros((3, 2), np.float32)), "crop_coords shape"),
])
def test_bad_inputs(model, inputs, change, match):
  with pytest.raises(ValueError, match=match):
    model(**{**inputs, **change})


def test_bad_options(model, inputs):
  with pytest.raises(ValueError, match="prior_token_drop shape"):
    model(**inputs, prior_token_drop=np.zeros((3,), bool))
  with pytest.raises(ValueError, match="glyph_mask shape"):
    model(**inputs, glyph_mask=np.ones((2, 4), bool))
  with pytest.raises(ValueError, match="cache_mode="):
    model(**inputs, cache_mode="append")
