"""GLM-Image DiT decoder (diffusers `GlmImageTransformer2DModel`) in Flax NNX.

Layout: latents are NCHW [B, C, H, W] like diffusers (the pipeline's latents, after
the VAE's mean/std normalisation), and the prediction (the flow-matching velocity) is
NCHW too, in `cfg.dtype`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.models.dit import kv_cache as kvc
from glmrl.models.dit.block import DiTBlock
from glmrl.models.dit.config import DiTConfig
from glmrl.models.dit.embeddings import TimeConditionEmbed, image_projector, patchify, unpatchify
from glmrl.models.dit.layers import MLP, layer_norm, linear
from glmrl.models.dit.rope import rope_tables, with_unrotated_prefix
from glmrl.sharding import EMBED, MLP as MLP_AXIS, VOCAB, constrain_batch


def _shape(x) -> tuple:
  return tuple(np.shape(x))


class GlmImageDiT(nnx.Module):
  """Flow-matching DiT conditioned on AR prior tokens, ByT5 glyph embeddings, time and size."""

  def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    e = cfg.inner_dim
    self.image_proj = image_projector(cfg, rngs=rngs)
    self.glyph_proj = MLP(cfg, cfg.text_embed_dim, e, e, "gelu", (None, MLP_AXIS), (MLP_AXIS, EMBED), rngs=rngs)
    self.prior_embed = nnx.Embed(
        cfg.prior_vq_quantizer_codebook_size, e, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
        embedding_init=nnx.initializers.normal(1.0), embedding_metadata={"out_sharding": (VOCAB, EMBED)})
    self.prior_proj = MLP(cfg, e, e, e, "silu", (EMBED, MLP_AXIS), (MLP_AXIS, EMBED), rngs=rngs)
    self.time_embed = TimeConditionEmbed(cfg, rngs=rngs)
    self.blocks = nnx.List([DiTBlock(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.norm_out = linear(cfg, cfg.time_embed_dim, 2 * e, (None, EMBED), rngs=rngs)
    self.proj_out = linear(cfg, e, cfg.patch_size**2 * cfg.out_channels, (EMBED, None), rngs=rngs)

  def __call__(self, latents, prior_token_ids, glyph_embeds, timestep, target_size, crop_coords, *,
               prior_token_drop=False, glyph_mask=None, kv_cache: kvc.DiTKVCache | None = None,
               cache_mode: str | None = None):
    """Velocity prediction [B, out_channels, H, W].

    latents: [B, in_channels, H, W], H and W multiples of patch_size.
    prior_token_ids: int [B, (H/p)(W/p)] (or [(H/p)(W/p)], shared by the batch): the AR
      model's visual tokens upsampled to the patch grid, row-major (ids outside the codebook
      give NaN, jnp.take's fill mode).
    glyph_embeds: [B or 1, T, text_embed_dim] ByT5 glyph embeddings (T may be 0).
    timestep: [B] or scalar, the pipeline's `t - 1` on the 0..1000 scale.
    target_size, crop_coords: [B, 2] (or [2] / [1, 2]) as (height, width) / (top, left) in pixels.
    prior_token_drop: bool broadcastable to [B, (H/p)(W/p)] ([B, 1]: per sample); True zeroes
      that token's embedding (all True = the unconditional branch of classifier-free guidance).
    glyph_mask: optional bool [B, T], False marks padding glyph tokens that no token may
      attend to (not in the reference, which attends to the pipeline's zero padding).
    kv_cache, cache_mode: None, or "write" / "read" / "skip" (see `kv_cache.py`); with a
      mode the call returns (prediction, cache): "write" returns the cache of this pass,
      appended to `kv_cache` when one is given; "read" and "skip" return `kv_cache` as is.
    """
    cfg = self.cfg
    b, hp, wp, t = self._check_inputs(latents, prior_token_ids, glyph_embeds, timestep, target_size,
                                      crop_coords, prior_token_drop, glyph_mask, kv_cache, cache_mode)
    p = cfg.patch_size

    latents = jnp.asarray(latents).astype(cfg.dtype)
    img_BxXxE = self.image_proj(patchify(latents, p))
    glyph = jnp.broadcast_to(jnp.asarray(glyph_embeds), (b, t, cfg.text_embed_dim)).astype(cfg.dtype)
    txt_BxTxE = self.glyph_proj(glyph)

    ids = jnp.broadcast_to(jnp.asarray(prior_token_ids), (b, hp * wp))
    drop = jnp.broadcast_to(jnp.asarray(prior_token_drop, bool), (b, hp * wp))
    prior_BxXxE = jnp.where(drop[..., None], jnp.zeros((), cfg.dtype), self.prior_embed(ids))
    img_BxXxE = img_BxXxE + self.prior_proj(prior_BxXxE)

    timestep_B = jnp.broadcast_to(jnp.asarray(timestep, jnp.float32), (b,))
    target_Bx2 = jnp.broadcast_to(jnp.asarray(target_size, jnp.float32).reshape(-1, 2), (b, 2))
    crop_Bx2 = jnp.broadcast_to(jnp.asarray(crop_coords, jnp.float32).reshape(-1, 2), (b, 2))
    temb_BxC = self.time_embed(timestep_B, target_Bx2, crop_Bx2)

    cos_SxD, sin_SxD = with_unrotated_prefix(*rope_tables(hp, wp, cfg.attention_head_dim), t)
    own_valid_BxS = None
    if glyph_mask is not None:
      own_valid_BxS = jnp.concatenate([jnp.asarray(glyph_mask, bool), jnp.ones((b, hp * wp), bool)], axis=1)
    key_valid_BxK = own_valid_BxS
    if cache_mode == "read":
      own = own_valid_BxS if own_valid_BxS is not None else jnp.ones((b, t + hp * wp), bool)
      key_valid_BxK = jnp.concatenate([kvc.valid_for_batch(kv_cache, b), own], axis=1)

    block_fn = nnx.remat(_run_block) if cfg.remat else _run_block
    new_k, new_v = [], []
    for i, block in enumerate(self.blocks):
      cached_kv = kvc.layer_slots_for_batch(kv_cache, i, b) if cache_mode == "read" else None
      img_BxXxE, txt_BxTxE = constrain_batch(img_BxXxE), constrain_batch(txt_BxTxE)
      img_BxXxE, txt_BxTxE, (k, v) = block_fn(block, img_BxXxE, txt_BxTxE, temb_BxC, cos_SxD, sin_SxD,
                                              key_valid_BxK, cached_kv)
      if cache_mode == "write":
        new_k.append(k)
        new_v.append(v)

    # Final AdaLN: the projection takes temb as is (already silu'd); scale comes first.
    scale_shift = self.norm_out(temb_BxC.astype(img_BxXxE.dtype))
    scale_BxE, shift_BxE = jnp.split(scale_shift, 2, axis=-1)
    img_BxXxE = layer_norm(img_BxXxE) * (1 + scale_BxE[:, None]) + shift_BxE[:, None]
    pred = unpatchify(self.proj_out(img_BxXxE), hp, wp, p)

    if cache_mode is None:
      return pred
    if cache_mode == "write":
      valid = own_valid_BxS if own_valid_BxS is not None else jnp.ones((b, t + hp * wp), bool)
      written = kvc.DiTKVCache(jnp.stack(new_k), jnp.stack(new_v), valid)
      return pred, (written if kv_cache is None else kvc.append_images(kv_cache, written))
    return pred, kv_cache

  def _check_inputs(self, latents, prior_token_ids, glyph_embeds, timestep, target_size, crop_coords,
                    prior_token_drop, glyph_mask, kv_cache, cache_mode):
    """Host-side shape checks; returns (batch, patch rows, patch cols, text length)."""
    cfg = self.cfg
    p = cfg.patch_size
    shape = _shape(latents)
    if len(shape) != 4 or shape[1] != cfg.in_channels:
      raise ValueError(f"latents shape {shape} must be [B, {cfg.in_channels}, H, W] (NCHW)")
    b, _, h, w = shape
    if h % p or w % p or h == 0 or w == 0:
      raise ValueError(f"latents spatial size {(h, w)} must be positive multiples of patch_size={p}")
    hp, wp = h // p, w // p
    n = hp * wp

    ids_shape = _shape(prior_token_ids)
    if ids_shape not in ((b, n), (n,)):
      raise ValueError(f"prior_token_ids shape {ids_shape} must be [{b}, {n}] or [{n}] for latents {shape}")
    ids_dtype = getattr(prior_token_ids, "dtype", None) or np.asarray(prior_token_ids).dtype
    if not jnp.issubdtype(ids_dtype, jnp.integer):
      raise ValueError(f"prior_token_ids must be integers, got {ids_dtype}")
    try:
      ok = np.broadcast_shapes(_shape(prior_token_drop), (b, n)) == (b, n)
    except ValueError:
      ok = False
    if not ok:
      raise ValueError(f"prior_token_drop shape {_shape(prior_token_drop)} does not broadcast to [{b}, {n}] "
                       "(use [B, 1] to drop per sample)")

    g_shape = _shape(glyph_embeds)
    if len(g_shape) != 3 or g_shape[0] not in (1, b) or g_shape[2] != cfg.text_embed_dim:
      raise ValueError(f"glyph_embeds shape {g_shape} must be [{b} or 1, T, {cfg.text_embed_dim}]")
    t = g_shape[1]
    if glyph_mask is not None and _shape(glyph_mask) != (b, t):
      raise ValueError(f"glyph_mask shape {_shape(glyph_mask)} must be [{b}, {t}]")

    if _shape(timestep) not in ((), (1,), (b,)):
      raise ValueError(f"timestep shape {_shape(timestep)} must be [{b}] or a scalar")
    for name, value in (("target_size", target_size), ("crop_coords", crop_coords)):
      if _shape(value) not in ((2,), (1, 2), (b, 2)):
        raise ValueError(f"{name} shape {_shape(value)} must be [{b}, 2] or [2]")

    if cache_mode not in (None,) + kvc.CACHE_MODES:
      raise ValueError(f"cache_mode={cache_mode!r} must be None or one of {kvc.CACHE_MODES}")
    if cache_mode is None and kv_cache is not None:
      raise ValueError("kv_cache given without cache_mode: pass cache_mode='read', 'write' or 'skip'")
    if cache_mode == "read" and kv_cache is None:
      raise ValueError("cache_mode='read' needs a kv_cache (from a cache_mode='write' pass)")
    if kv_cache is not None:
      kvc.check_cache(kv_cache, cfg.num_layers, cfg.num_attention_heads, cfg.attention_head_dim,
                      b if cache_mode == "read" else kv_cache.num_slots)
      if cache_mode == "write" and kv_cache.num_slots != b:
        raise ValueError(f"cache_mode='write' appends to each slot: kv_cache has {kv_cache.num_slots} slots, "
                         f"the batch is {b}")
    return b, hp, wp, t


def _run_block(block, img, txt, temb, cos, sin, key_valid, cached_kv):
  return block(img, txt, temb, cos, sin, key_valid, cached_kv)
