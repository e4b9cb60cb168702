"""Shared by the DiT tests: the diffusers oracle and loading its weights through the key map."""

import glmrl  # noqa: F401

import jax
import numpy as np
import torch
from diffusers import GlmImageTransformer2DModel
from flax import nnx

from checkpoints_convert.maps.dit import RULES
from glmrl.models.dit import DiTConfig, GlmImageDiT
from tests import torch_port



def reference(cfg: DiTConfig, seed: int = 0) -> GlmImageTransformer2DModel:
  torch.manual_seed(seed)
  return GlmImageTransformer2DModel.from_config(cfg.to_hf()).eval()




def abstract_model(cfg: DiTConfig) -> GlmImageDiT:
  """The model with ShapeDtypeStruct parameters (skips the random init)."""
  return nnx.eval_shape(lambda: GlmImageDiT(cfg, rngs=nnx.Rngs(0)))


def ported(ref: GlmImageTransformer2DModel, cfg: DiTConfig) -> GlmImageDiT:
  """Our model holding the reference's weights."""
  model = abstract_model(cfg)
  assert not jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param))), "the model has non-Param state"
  torch_port.load_state_dict(model, ref.state_dict(), RULES)
  return model


def t(x) -> torch.Tensor:
  return torch.from_numpy(np.asarray(x))


def ref_forward(ref, latents, prior_token_ids, glyph_embeds, timestep, target_size, crop_coords,
                prior_token_drop, kv_caches=None) -> np.ndarray:
  """The reference forward on numpy inputs; prior_token_drop is a bool array like the ids."""
  with torch.no_grad():
    out = ref(hidden_states=t(latents), encoder_hidden_states=t(glyph_embeds),
              prior_token_id=t(prior_token_ids), prior_token_drop=t(prior_token_drop),
              timestep=t(timestep), target_size=t(target_size), crop_coords=t(crop_coords),
              kv_caches=kv_caches, return_dict=False)[0]
  return out.numpy()


def max_abs(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def t2i_inputs(cfg: DiTConfig, seed: int, batch: int, height: int, width: int, text_len: int) -> dict:
  """Pipeline-like inputs: latents [B, C, h, w], timesteps t - 1, target size in pixels (VAE x8)."""
  rng = np.random.default_rng(seed)
  n = (height // cfg.patch_size) * (width // cfg.patch_size)
  return dict(
      latents=rng.standard_normal((batch, cfg.in_channels, height, width)).astype(np.float32),
      prior_token_ids=rng.integers(0, cfg.prior_vq_quantizer_codebook_size, (batch, n)),
      glyph_embeds=rng.standard_normal((batch, text_len, cfg.text_embed_dim)).astype(np.float32),
      timestep=rng.uniform(0, 999, (batch,)).astype(np.float32),
      target_size=np.tile(np.array([[8 * height, 8 * width]], np.float32), (batch, 1)),
      crop_coords=np.zeros((batch, 2), np.float32),
  )


def _forward(model, latents, prior_token_ids, glyph_embeds, timestep, target_size, crop_coords,
             prior_token_drop, glyph_mask, kv_cache, cache_mode):
  return model(latents, prior_token_ids, glyph_embeds, timestep, target_size, crop_coords,
               prior_token_drop=prior_token_drop, glyph_mask=glyph_mask, kv_cache=kv_cache,
               cache_mode=cache_mode)


_jitted_forward = nnx.jit(_forward, static_argnames=("cache_mode",))


def forward(model, inputs: dict, *, prior_token_drop=False, glyph_mask=None, kv_cache=None, cache_mode=None):
  """The jitted model on an inputs dict (one compilation per input shape)."""
  return _jitted_forward(model, inputs["latents"], inputs["prior_token_ids"], inputs["glyph_embeds"],
                         inputs["timestep"], inputs["target_size"], inputs["crop_coords"],
                         prior_token_drop, glyph_mask, kv_cache, cache_mode)
