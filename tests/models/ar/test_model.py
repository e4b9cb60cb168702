"""GlmImageAR parity with transformers' GlmImageForConditionalGeneration (float32, tiny random config).

Tolerances: logits 1e-4 max abs (valid positions) against the torch reference; condition-image
token ids exactly equal; KV-cache prefill + decode vs the uncached forward 1e-5 max abs.
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import GlmImageConfig, GlmImageForConditionalGeneration

from checkpoints_convert.maps.ar import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl import sharding
from glmrl.models import glm_image
from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.model import GlmImageAR, merge_image_tokens
from tests import torch_port

ATOL_LOGITS = 1e-4
ATOL_CACHE = 1e-5
FULL_PARAMS = 10_114_245_632
KEYMAP = KeyMap(RULES)
CFG = ARConfig.tiny()
TEXT_IDS = (CFG.text.vision_vocab_size, CFG.text.pad_token_id)  # plain text ids: [80, 150)


def reference_model(cfg: ARConfig):
  """The torch oracle with weights re-drawn larger than its init (so every path matters)."""
  torch.manual_seed(0)
  ref = GlmImageForConditionalGeneration(GlmImageConfig(**cfg.to_hf())).eval()
  ref.config._attn_implementation = "eager"
  with torch.no_grad():
    for name, p in ref.named_parameters():
      is_norm_scale = "norm" in name.split(".")[-2] and name.endswith("weight")
      p.copy_(1 + 0.1 * torch.randn_like(p) if is_norm_scale else 0.1 * torch.randn_like(p))
  return ref


def abstract_model(cfg: ARConfig):
  """The model without initialised weights (all of them come from the reference)."""
  return nnx.eval_shape(lambda: GlmImageAR(cfg, rngs=nnx.Rngs(0)))




@pytest.fixture(scope="module")
def models():
  ref = reference_model(CFG)
  ours = abstract_model(CFG)
  torch_port.load_state_dict(ours, ref.state_dict(), RULES)
  return ref, ours


@pytest.fixture(scope="module")
def forward():
  return nnx.jit(GlmImageAR.__call__)


def left_pad(seqs):
  length = max(len(s) for s in seqs)
  ids = np.full((len(seqs), length), CFG.text.pad_token_id, np.int64)
  mask = np.zeros((len(seqs), length), np.int64)
  for b, s in enumerate(seqs):
    ids[b, length - len(s):] = s
    mask[b, length - len(s):] = 1
  return ids, mask


def t2i_batch(rng):
  """Two text-to-image prompts of different lengths, each ending in the image start marker."""
  seqs = [list(rng.integers(*TEXT_IDS, n)) + [CFG.image_start_token_id] for n in (8, 5)]
  ids, mask = left_pad(seqs)
  # Per sample: the small preview grid and the target grid (both still to be generated).
  grids = torch.tensor([[1, 2, 2], [1, 4, 4]] * 2)
  return ids, mask, grids, torch.tensor([2, 2])


def i2i_batch(rng):
  """Two image-to-image prompts: one and two condition images of different shapes."""
  p = CFG.vision.patch_size
  sources = ([(1, 3, 5)], [(1, 4, 4), (1, 2, 10)])
  target = (1, 4, 4)
  seqs = []
  for grids, lead in zip(sources, (5, 3)):
    seq = list(rng.integers(*TEXT_IDS, lead))
    for _, h, w in grids:
      seq += [CFG.image_start_token_id] + [CFG.image_token_id] * (h * w) + [CFG.image_end_token_id]
      seq += list(rng.integers(*TEXT_IDS, 2))
    seqs.append(seq + [CFG.image_start_token_id])
  ids, mask = left_pad(seqs)
  src = [g for grids in sources for g in grids]
  all_grids = torch.tensor([g for grids in sources for g in (*grids, target)])
  pixels = torch.from_numpy(rng.standard_normal((sum(h * w for _, h, w in src), 3 * p * p)).astype(np.float32))
  return ids, mask, all_grids, torch.tensor([len(g) + 1 for g in sources]), pixels, np.array(src)


def test_text_to_image_logits(models, forward):
  ref, ours = models
  ids, mask, grids, per_sample = t2i_batch(np.random.default_rng(0))
  pos, _ = ref.model.get_rope_index(torch.tensor(ids), image_grid_thw=grids, images_per_sample=per_sample,
                                    attention_mask=torch.tensor(mask))
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=pos).logits.numpy()
  got = np.asarray(forward(ours, jnp.asarray(ids), jnp.asarray(pos.numpy()), jnp.asarray(mask)))
  assert got.dtype == np.float32 and got.shape == (2, ids.shape[1], CFG.text.vision_vocab_size)
  valid = mask.astype(bool)
  np.testing.assert_allclose(got[valid], want[valid], rtol=0, atol=ATOL_LOGITS)


def test_image_to_image_logits_and_tokens(models, forward):
  ref, ours = models
  ids, mask, grids, per_sample, pixels, src = i2i_batch(np.random.default_rng(1))
  pos, _ = ref.model.get_rope_index(torch.tensor(ids), image_grid_thw=grids, images_per_sample=per_sample,
                                    attention_mask=torch.tensor(mask))
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=pos,
               pixel_values=pixels, image_grid_thw=grids, images_per_sample=per_sample).logits.numpy()
    feats = ref.model.get_image_features(pixels, torch.tensor(src)).pooler_output
    want_tokens = ref.model.get_image_tokens(feats).numpy()
  tokens = np.asarray(ours.image_tokens(pixels.numpy(), src))
  np.testing.assert_array_equal(tokens, want_tokens)
  merged = merge_image_tokens(ids, tokens, CFG.image_token_id)
  got = np.asarray(forward(ours, jnp.asarray(merged), jnp.asarray(pos.numpy()), jnp.asarray(mask)))
  valid = mask.astype(bool)
  np.testing.assert_allclose(got[valid], want[valid], rtol=0, atol=ATOL_LOGITS)


def test_kv_cache_matches_uncached_forward(models):
  ref, ours = models
  ids, mask, grids, per_sample = t2i_batch(np.random.default_rng(2))
  pos, _ = ref.model.get_rope_index(torch.tensor(ids), image_grid_thw=grids, images_per_sample=per_sample,
                                    attention_mask=torch.tensor(mask))
  n_new = 4
  decode_pos = ref.model._cached_decode_position_ids[:, :, :n_new].permute(1, 0, 2).numpy()
  new_ids = np.random.default_rng(3).integers(0, CFG.vq.num_embeddings, (2, n_new))
  all_ids = np.concatenate([ids, new_ids], 1)
  all_pos = np.concatenate([pos.numpy(), decode_pos], 2)
  all_valid = np.concatenate([mask, np.ones_like(new_ids)], 1).astype(bool)
  want = np.asarray(nnx.jit(GlmImageAR.hidden_states)(ours, all_ids, all_pos, all_valid))

  prompt_len, slots = ids.shape[1], all_ids.shape[1] + 3  # spare slots stay masked out
  key_valid = np.zeros((2, slots), bool)
  key_valid[:, :all_ids.shape[1]] = all_valid
  traces = []

  def step_fn(model, *args):
    traces.append(None)
    return model.step(*args)

  step = nnx.jit(step_fn)

  def decode(prefill):
    h, cache = prefill(ours, ids, pos.numpy(), key_valid, ours.init_cache(2, slots))
    got = [np.asarray(h)]
    for j in range(n_new):
      s = prompt_len + j
      h, cache = step(ours, all_ids[:, s:s + 1], all_pos[:, :, s:s + 1], key_valid, cache, jnp.int32(s))
      got.append(np.asarray(h))
    return np.concatenate(got, 1)

  got = decode(lambda *args: step(*args, jnp.int32(0)))
  np.testing.assert_allclose(got[all_valid], want[all_valid], rtol=0, atol=ATOL_CACHE)
  assert len(traces) == 2  # prefill + one decode shape: `start` is traced, not static
  # The sampler's prefill, a Python 0 as `start`: queries attend over the prompt's own keys, not the cache's slots.
  got = decode(nnx.jit(lambda model, *args: model.step(*args, 0)))
  np.testing.assert_allclose(got[all_valid], want[all_valid], rtol=0, atol=ATOL_CACHE)


def test_remat_and_bf16_variants(models):
  _, ours = models
  ids, mask, _, _ = t2i_batch(np.random.default_rng(4))
  pos = np.broadcast_to(np.arange(ids.shape[1]), (3,) + ids.shape)
  params = nnx.state(ours, nnx.Param)
  remat = abstract_model(ARConfig.tiny(remat=True))
  nnx.update(remat, params)

  def loss(model):
    return jnp.sum(model.hidden_states(ids, pos, mask) ** 2 * mask[..., None])

  grad_fn = nnx.jit(nnx.value_and_grad(loss))
  want, want_grad = grad_fn(ours)
  got, got_grad = grad_fn(remat)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  low = abstract_model(ARConfig.tiny(dtype=jnp.bfloat16))
  nnx.update(low, params)
  logits = nnx.jit(GlmImageAR.__call__)(low, ids, pos, mask)
  assert logits.dtype == jnp.float32 and bool(jnp.isfinite(logits).all())


def test_full_parameter_count():
  """The released sizes, built abstractly as a run builds them (`glm_image.abstract_model`)."""
  graphdef, state = glm_image.abstract_model("ar", ARConfig.full())
  ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(nnx.merge(graphdef, state), nnx.Param)))
  with torch.device("meta"):
    ref = GlmImageForConditionalGeneration(GlmImageConfig(**ARConfig.full().to_hf()))
  assert sum(p.numel() for p in ref.parameters()) == FULL_PARAMS
  assert ours == FULL_PARAMS


def test_every_param_has_logical_sharding(models):
  _, ours = models
  names = {sharding.EMBED, sharding.MLP, sharding.HEADS, sharding.KV, sharding.VOCAB, sharding.CONV_IN,
           sharding.CONV_OUT, None}
  for path, var in nnx.to_flat_state(nnx.state(ours, nnx.Param)):
    spec = var.get_metadata().get("out_sharding")
    assert spec is not None and len(spec) == var[...].ndim, (flax_path_str(path), spec)
    assert set(spec) <= names, (flax_path_str(path), spec)


def test_bad_inputs_raise(models):
  _, ours = models
  ids = np.zeros((2, 5), np.int32)
  pos = np.zeros((3, 2, 5), np.int32)
  with pytest.raises(ValueError, match="positions"):
    ours.hidden_states(ids, pos[:, :1], np.ones((2, 5)))
  with pytest.raises(ValueError, match="valid"):
    ours.hidden_states(ids, pos, np.ones((2, 4)))
  cache = ours.init_cache(2, 8)
  with pytest.raises(ValueError, match="key_valid"):
    ours.step(ids, pos, np.ones((2, 5)), cache, 0)
  with pytest.raises(ValueError, match="cache batch"):
    ours.step(ids, pos, np.ones((2, 8)), ours.init_cache(3, 8), 0)
  p = CFG.vision.patch_dim
  with pytest.raises(ValueError, match="temporal"):
    ours.image_tokens(np.zeros((8, p), np.float32), np.array([[2, 2, 2]]))
  with pytest.raises(ValueError, match="covers 4 patches"):
    ours.image_tokens(np.zeros((5, p), np.float32), np.array([[1, 2, 2]]))
  with pytest.raises(ValueError, match="pixel_values"):
    ours.image_tokens(np.zeros((4, p + 1), np.float32), np.array([[1, 2, 2]]))
  with pytest.raises(ValueError, match="placeholder"):
    merge_image_tokens(np.full((1, 3), CFG.image_token_id), np.arange(2), CFG.image_token_id)
