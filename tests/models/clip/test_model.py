"""CLIP parity with transformers' CLIPModel (float32, tiny random configs, weights via the key map).

Tolerance: 1e-4 max abs on the normalised image and text embeddings, the projected features and
the logits (scale exp(3.1) ~ 22).
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from checkpoints_convert.maps.clip import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.models.clip import ClipConfig, ClipModel
from tests.models.clip import tiny
from tests.torch_port import abstract, port
from tests import torch_port

ATOL = 1e-4
KEYMAP = KeyMap(RULES)


def flax_params(model) -> dict:
  return {flax_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.fixture(scope="module", params=["legacy", "gelu"])
def models(request):
  cfg = tiny.config(request.param)
  ref = tiny.reference_model(cfg)
  return cfg, ref, port(ref, ClipModel, cfg, RULES)


def _inputs(cfg, seed=0):
  rng = np.random.default_rng(seed)
  pixels = rng.standard_normal((3, 3, cfg.vision.image_size, cfg.vision.image_size)).astype(np.float32)
  length = cfg.text.max_position_embeddings
  ids = rng.integers(0, tiny.EOS_ID - 1, (4, length))
  mask = np.ones_like(ids)
  # Right padding with the end token, as the CLIP tokenizer pads; row 3 fills the whole length.
  for row, n in enumerate((5, 9, 2, length - 1)):
    ids[row, n] = tiny.EOS_ID
    ids[row, n + 1:] = tiny.EOS_ID
    mask[row, n + 1:] = 0
  return pixels, ids, mask



def test_key_map_coverage_and_round_trip(models):
  _, ref, ours = models
  sd = ref.state_dict()
  torch_port.assert_rules_cover(RULES, set(sd), flax_params(ours))
  for key, tensor in sd.items():
    path, transform = KEYMAP.hf_to_flax(key)
    hf_key, back = KEYMAP.flax_to_hf(path)
    assert hf_key == key
    assert np.array_equal(back.to_hf(transform.to_flax(tensor.numpy())), tensor.numpy())


def test_outputs_match_clipmodel(models):
  cfg, ref, ours = models
  pixels, ids, mask = _inputs(cfg)
  with torch.no_grad():
    want = ref(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
               pixel_values=torch.from_numpy(pixels))
    want_text = ref.get_text_features(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    want_image = ref.get_image_features(pixel_values=torch.from_numpy(pixels))

  @nnx.jit
  def run(model, px, i, m):
    return model(px, i, m), model.text_features(i, m), model.image_features(px)

  got, text, image = run(ours, jnp.asarray(pixels.transpose(0, 2, 3, 1)), jnp.asarray(ids), jnp.asarray(mask))
  assert got.image_embeds.shape == (3, cfg.projection_dim) and got.logits_per_image.shape == (3, 4)
  for a, b in ((got.image_embeds, want.image_embeds), (got.text_embeds, want.text_embeds),
               (got.logits_per_image, want.logits_per_image), (text, want_text.pooler_output),
               (image, want_image.pooler_output)):
    np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=0, atol=ATOL)


def test_padding_mask_does_not_change_pooled_text(models):
  """Causal attention + end-token pooling: the pooled embedding ignores what follows the end token
  (id 7 is below the end token's, so the legacy argmax pooling still finds the same position)."""
  cfg, _, ours = models
  _, ids, mask = _inputs(cfg, seed=1)
  other = ids.copy()
  other[mask == 0] = 7
  f = nnx.jit(lambda m, i, a: m.text_features(i, a))
  a = f(ours, jnp.asarray(ids), jnp.asarray(mask))
  b = f(ours, jnp.asarray(other), jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["full", "vit_h14"])
def test_full_size_shapes_param_count_and_coverage(name):
  """The released layouts at full width, one layer per tower (depth only repeats a layer; tracing all
  56 layers of ViT-H/14 costs ~10 s), against transformers on the meta device; the full parameter
  count follows from the per-layer counts."""
  full = getattr(ClipConfig, name)()
  cfg = dataclasses.replace(full, text=dataclasses.replace(full.text, num_hidden_layers=1),
                            vision=dataclasses.replace(full.vision, num_hidden_layers=1))
  with torch.device("meta"):
    ref = transformers.CLIPModel(transformers.CLIPConfig(**cfg.to_hf()))
  params = flax_params(abstract(ClipModel, cfg))
  sizes = {k: int(np.prod(v.shape)) for k, v in params.items()}
  assert sum(sizes.values()) == sum(p.numel() for p in ref.parameters())
  sd = ref.state_dict()
  torch_port.assert_rules_cover(RULES, set(sd), params)
  for key, tensor in sd.items():
    path, transform = KEYMAP.hf_to_flax(key)
    assert transform.flax_shape(tuple(tensor.shape)) == tuple(params[path].shape), key
  per_layer = {t: sum(n for k, n in sizes.items() if k.startswith(f"{t}.layers.0.")) for t in ("text", "vision")}
  total = (sum(sizes.values()) + (full.text.num_hidden_layers - 1) * per_layer["text"]
           + (full.vision.num_hidden_layers - 1) * per_layer["vision"])
  assert total == {"full": 427_616_513, "vit_h14": 986_109_441}[name]


def test_config_round_trip_and_legacy_sub_config_dicts():
  for cfg in (tiny.config("legacy"), tiny.config("gelu"), ClipConfig.full(), ClipConfig.vit_h14()):
    assert ClipConfig.from_hf(cfg.to_hf()) == cfg
    assert ClipConfig.from_hf(transformers.CLIPConfig(**cfg.to_hf()).to_dict()) == cfg
  # Old hub configs carry stale `text_config` next to the `text_config_dict` that transformers uses.
  old = {"model_type": "clip", "projection_dim": 768,
         "text_config": {"hidden_size": 512}, "text_config_dict": {"hidden_size": 768, "intermediate_size": 3072,
                                                                   "num_attention_heads": 12, "eos_token_id": 2},
         "vision_config": None, "vision_config_dict": {"hidden_size": 1024, "intermediate_size": 4096,
                                                       "num_hidden_layers": 24, "num_attention_heads": 16,
                                                       "patch_size": 14}}
  cfg = ClipConfig.from_hf(old)
  ref = transformers.CLIPConfig(**{k: v for k, v in old.items() if k != "model_type"})
  assert cfg.text.hidden_size == ref.text_config.hidden_size == 768
  assert cfg.vision.patch_size == ref.vision_config.patch_size == 14
  # The keys it leaves out take transformers' defaults (bos_token_id 49406).
  assert cfg == ClipConfig.full(text=dataclasses.replace(ClipConfig.full().text, bos_token_id=49406))


def test_bad_configs():
  with pytest.raises(ValueError, match="model_type='t5'"):
    ClipConfig.from_hf({"model_type": "t5"})
  with pytest.raises(ValueError, match="hidden_act='swish'"):
    ClipConfig.from_hf({"text_config": {"hidden_act": "swish"}})
  with pytest.raises(ValueError, match="not divisible by num_attention_heads=5"):
    ClipConfig.from_hf({"vision_config": {"hidden_size": 64, "num_attention_heads": 5}})
  with pytest.raises(ValueError, match=r"overrides \['remat'\]"):
    ClipConfig.from_hf({}, remat=True)


def test_bad_inputs(models):
  cfg, _, ours = models
  with pytest.raises(ValueError, match=r"input_ids must be \[B, L\]"):
    ours.text_features(jnp.zeros((5,), jnp.int32))
  with pytest.raises(ValueError, match="exceeds max_position_embeddings=16"):
    ours.text_features(jnp.zeros((1, 17), jnp.int32))
  with pytest.raises(ValueError, match="attention_mask shape"):
    ours.text_features(jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 4), jnp.int32))
  with pytest.raises(ValueError, match=r"pixel_values must be \[B, 32, 32, 3\]"):
    ours.image_features(jnp.zeros((1, 3, 32, 32)))
