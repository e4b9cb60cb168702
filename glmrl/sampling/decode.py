"""AR target-grid tokens -> pixels: DiT flow-matching denoising with classifier-free guidance, then VAE.

The whole denoising loop is one compiled `lax.fori_loop`; the DiT runs the conditional branch
(prior tokens, glyph embeddings, source-image KV cache read) and the unconditional branch (prior
tokens dropped, the empty prompt's glyph embedding, cache skipped) at every step, as
`GlmImagePipeline` does. Image-to-image first writes the condition images into the DiT's KV
cache (`write_source_cache`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from flax import struct

from glmrl import sharding as sharding_lib
from glmrl.grpo import flow
from glmrl.grpo._checks import is_static
from glmrl.models.dit import kv_cache as kvc
from glmrl.sampling import gaussian
from glmrl.sampling.scheduler import euler_step_at


def upsample_prior_tokens(grid_Bxhxw: jax.Array) -> jax.Array:
  """Nearest x2 upsampling of the AR token grid to the DiT patch grid, row-major: [B, 4HW]."""
  up = jnp.repeat(jnp.repeat(grid_Bxhxw, 2, axis=1), 2, axis=2)
  return up.reshape(up.shape[0], -1)


def to_uint8(images_Bxhxwx3: jax.Array) -> jax.Array:
  """Decoder output in [-1, 1] -> uint8, as diffusers' VaeImageProcessor.postprocess."""
  x = jnp.clip(images_Bxhxwx3.astype(jnp.float32) * 0.5 + 0.5, 0.0, 1.0)
  return jnp.round(x * 255.0).astype(jnp.uint8)


@struct.dataclass
class Conditioning:
  """Per-sample DiT conditioning of one batch (all [B, ...])."""
  prior_ids_BxX: jax.Array     # upsampled AR target-grid tokens
  glyph_BxSxD: jax.Array       # ByT5 glyph embeddings of the prompt
  glyph_mask_BxS: jax.Array    # False on padding glyph tokens
  neg_glyph_BxSxD: jax.Array   # glyph embeddings of the empty (negative) prompt
  neg_glyph_mask_BxS: jax.Array


@dataclasses.dataclass(frozen=True)
class SdeWindow:
  """Flow-GRPO's stochastic steps: `size` consecutive SDE steps (the trained timesteps), the ODE's Euler
  steps elsewhere. `noise_level` is the SDE's a (`glmrl.grpo.flow`). Where the window starts is data
  (`denoise`'s `window_start`, a traced step index), so a window that moves between rollouts
  (Flow-GRPO-Fast / MixGRPO) runs one compiled program."""
  noise_level: float
  size: int
  sde_type: str = "sde"  # "sde" (Flow-GRPO's) or "cps" (`glmrl.grpo.flow.cps_step_mean`)
  logprob: str = "density"  # the steps' log-prob (`glmrl.grpo.flow.step_logprob`)

@struct.dataclass
class Trajectory:
  """The SDE window's steps of each sample: x_t, x_{t+1} ([W, B, C, h, w]) and the sampler's log-prob of
  each step ([W, B]; diagnostics: a learner recomputes its own with its own forward)."""
  latents_before: jax.Array
  latents_after: jax.Array
  sampler_logp: jax.Array


def merge_dit(dit_def, dit_state):
  """The DiT of a state, or of a tuple of states (DiT LoRA: (adapters, base))."""
  return nnx.merge(dit_def, *dit_state) if isinstance(dit_state, tuple) else nnx.merge(dit_def, dit_state)


@functools.partial(jax.jit, static_argnames=("dit_def", "vae_def", "sde", "guidance_scale"))
def denoise_and_decode(dit_def, dit_state, vae_def, vae_state, cond: Conditioning, latents_BxCxhxw,
                       model_timesteps_s, sigmas_e, guidance_scale, target_size_Bx2, crop_Bx2,
                       source_cache: kvc.DiTKVCache | None = None, sde: SdeWindow | None = None, noise_keys_B=None,
                       window_start=0):
  """Runs the S denoising steps from `latents` and decodes: (uint8 images [B, H, W, 3], latents), plus the
  SDE window's Trajectory when `sde` is given (its noise drawn from `noise_keys_B`, one key per sample,
  the window starting at step `window_start`). `dit_state`: a state or a tuple of states. `guidance_scale` is
  static: 1.0 runs the conditional branch alone (`guided_velocity`)."""
  dit = merge_dit(dit_def, dit_state)
  out = denoise(dit, cond, latents_BxCxhxw, model_timesteps_s, sigmas_e, guidance_scale,
                target_size_Bx2, crop_Bx2, source_cache, sde=sde, noise_keys_B=noise_keys_B,
                window_start=window_start)
  latents = out[0] if sde is not None else out
  images = sharding_lib.per_device_samples(functools.partial(decode_images, vae_def), vae_state, latents)
  return (images, latents, out[1]) if sde is not None else (images, latents)


def decode_images(vae_def, vae_state, latents_BxCxhxw):
  """DiT latents -> uint8 images [B, H, W, 3] (the VAE's dtype); the decoder program runs it per device's samples."""
  vae = nnx.merge(vae_def, vae_state)
  return to_uint8(vae.decode_normalized(jnp.transpose(latents_BxCxhxw, (0, 2, 3, 1)).astype(vae.cfg.dtype)))


def guided_velocity(dit, cond: Conditioning, x_BxCxhxw, t, guidance_scale, target_size_Bx2, crop_Bx2,
                    source_cache=None):
  """The CFG-guided velocity v = v_u + g (v_c - v_u) at timestep t (float32): the conditional branch (prior
  tokens, glyph embeddings, source cache read) and the unconditional one (prior tokens dropped, the empty
  prompt's glyph embedding, cache skipped), as the reference pipeline. The sampler and the decoder policy
  update both call this one function.

  A static guidance_scale of 1.0 (CFG-free: the unconditional branch has weight 0) runs the conditional branch
  alone: one DiT pass instead of two. Its velocity is v_c itself, not v_u + 1 (v_c - v_u) (equal up to
  float32 rounding); a traced 1.0 takes the two-branch formula. With the DiT's `cfg_batched` (text-to-image) the
  two branches are one forward of twice the batch (`_both_branches`)."""
  batch = x_BxCxhxw.shape[0]
  read = "read" if source_cache is not None else None
  skip = "skip" if source_cache is not None else None

  def velocity(glyph, mask, drop, mode):
    out = dit(x_BxCxhxw, cond.prior_ids_BxX, glyph, jnp.full((batch,), t), target_size_Bx2, crop_Bx2,
              prior_token_drop=drop, glyph_mask=mask, kv_cache=source_cache, cache_mode=mode)
    return (out[0] if mode else out).astype(jnp.float32)

  if is_static(guidance_scale) and guidance_scale == 1.0:
    return velocity(cond.glyph_BxSxD, cond.glyph_mask_BxS, False, read)
  if dit.cfg.cfg_batched and source_cache is None:
    v_cond, v_uncond = _both_branches(dit, cond, x_BxCxhxw, t, target_size_Bx2, crop_Bx2)
  else:
    v_cond = velocity(cond.glyph_BxSxD, cond.glyph_mask_BxS, False, read)
    v_uncond = velocity(cond.neg_glyph_BxSxD, cond.neg_glyph_mask_BxS, jnp.ones((batch, 1), bool), skip)
  return v_uncond + guidance_scale * (v_cond - v_uncond)


def _both_branches(dit, cond: Conditioning, x_BxCxhxw, t, target_size_Bx2, crop_Bx2):
  """(v_cond, v_uncond) float32 from one DiT forward of 2B rows: row 2i is sample i's conditional branch, row 2i + 1
  its unconditional one (interleaved, so each device's rows of the batch-sharded inputs stay on it). The shorter
  glyph sequence is padded to the longer with masked tokens, which no token attends to."""
  batch = x_BxCxhxw.shape[0]
  length = max(cond.glyph_BxSxD.shape[1], cond.neg_glyph_BxSxD.shape[1])

  def padded(embeds, mask):
    extra = length - embeds.shape[1]
    return (jnp.pad(embeds, ((0, 0), (0, extra), (0, 0))), jnp.pad(mask, ((0, 0), (0, extra))))

  pairs = lambda a, b: jnp.stack([a, b], axis=1).reshape(2 * batch, *a.shape[1:])
  glyph_c, mask_c = padded(cond.glyph_BxSxD, cond.glyph_mask_BxS)
  glyph_u, mask_u = padded(cond.neg_glyph_BxSxD, cond.neg_glyph_mask_BxS)
  drop = pairs(jnp.zeros((batch, 1), bool), jnp.ones((batch, 1), bool))
  out = dit(pairs(x_BxCxhxw, x_BxCxhxw), pairs(cond.prior_ids_BxX, cond.prior_ids_BxX), pairs(glyph_c, glyph_u),
            jnp.full((2 * batch,), t) if jnp.ndim(t) == 0 else pairs(t, t), pairs(target_size_Bx2, target_size_Bx2),
            pairs(crop_Bx2, crop_Bx2), prior_token_drop=drop, glyph_mask=pairs(mask_c, mask_u))
  out_Bx2 = out.astype(jnp.float32).reshape(batch, 2, *out.shape[1:])
  return out_Bx2[:, 0], out_Bx2[:, 1]


def denoise(dit, cond: Conditioning, latents_BxCxhxw, model_timesteps_s, sigmas_e, guidance_scale,
            target_size_Bx2, crop_Bx2, source_cache=None, *, sde: SdeWindow | None = None, noise_keys_B=None,
            window_start=0):
  """The pipeline's Euler loop with CFG (`guided_velocity`): x <- x + (s' - s) v.

  With `sde`, the window's steps (from step `window_start`, a traced index) are Flow-GRPO's SDE steps
  instead (`glmrl.grpo.flow.sde_step`, noise eps ~ N(0, I) drawn per sample and step from
  fold_in(key, step)); returns (latents, Trajectory).
  """
  def guided(i, x):
    # The loop body's own module: rematerialised blocks (DiT cfg.remat, on when the decoder policy trains) write
    # back to their Variables, which must belong to the trace that calls them.
    step_dit = nnx.merge(*nnx.split(dit), copy=True) if dit.cfg.remat else dit
    return guided_velocity(step_dit, cond, x, model_timesteps_s[i], guidance_scale, target_size_Bx2, crop_Bx2,
                           source_cache)

  def step(i, x):
    return euler_step_at(sigmas_e, i, x, guided(i, x))

  x0 = latents_BxCxhxw.astype(jnp.float32)
  if sde is None:
    return jax.lax.fori_loop(0, model_timesteps_s.shape[0], step, x0)
  num_steps = model_timesteps_s.shape[0]
  if not 1 <= sde.size <= num_steps:
    raise ValueError(f"SDE window {sde} does not lie within the {num_steps} denoising steps")
  if not isinstance(window_start, jax.core.Tracer) and not 0 <= int(window_start) <= num_steps - sde.size:
    raise ValueError(f"window_start={int(window_start)}: an SDE window of {sde.size} steps starts in "
                     f"[0, {num_steps - sde.size}] of {num_steps} denoising steps")
  start = jnp.asarray(window_start, jnp.int32)

  def any_step(i, carry):
    x, record = carry
    v = guided(i, x)

    def sde_update(record):
      eps = jax.vmap(lambda k: gaussian.normal(jax.random.fold_in(k, i), x.shape[1:], jnp.float32))(noise_keys_B)
      x_next, logp_B = flow.sde_step(x, v, sigmas_e[i], sigmas_e[i + 1], sde.noise_level, eps,
                                     sde_type=sde.sde_type, logprob=sde.logprob)
      w = i - start
      return x_next, Trajectory(record.latents_before.at[w].set(x), record.latents_after.at[w].set(x_next),
                                record.sampler_logp.at[w].set(logp_B))

    # One loop of one DiT: the window's steps differ from the others only in the update that follows the velocity
    # (three loops, before, in and after the window, would compile the DiT three times into the program).
    in_window = (i >= start) & (i < start + sde.size)
    return jax.lax.cond(in_window, sde_update, lambda record: (euler_step_at(sigmas_e, i, x, v), record), record)

  shape = (sde.size,) + x0.shape
  record = Trajectory(jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32),
                      jnp.zeros((sde.size, x0.shape[0]), jnp.float32))
  x, record = jax.lax.fori_loop(0, num_steps, any_step, (x0, record))
  return x, record


def encode_latents(vae_def, vae_state, pixels_Bxhxwx3):
  """Pixels in [-1, 1] -> normalised latents [B, C, h, w] (the posterior's mode); 2.77 GiB of temporaries per v5p
  chip for one 1024^2 image as one GSPMD program, 0.91 per device's own samples (libtpu compile)."""
  vae = nnx.merge(vae_def, vae_state)
  return jnp.transpose(vae.encode_normalized(pixels_Bxhxwx3.astype(vae.cfg.dtype)), (0, 3, 1, 2))


@functools.partial(jax.jit, static_argnames=("dit_def", "vae_def"))
def write_source_cache(dit_def, dit_state, vae_def, vae_state, images_PxGxhxwx3, prior_ids_PxGxX) -> kvc.DiTKVCache:
  """Image-to-image: the DiT KV cache of P prompts' n condition images each, one slot per prompt.

  `images`: uint8 condition images; `prior_ids`: their AR VQ grids upsampled to the DiT patch
  grid (`upsample_prior_tokens`). As the reference pipeline: pixels to [-1, 1], the VAE
  posterior's mode, normalised with the latent statistics, then a DiT pass in "write" mode at
  timestep 0 with no glyph tokens and no prior token dropped, the image's own size as target
  size and a zero crop; a prompt's images follow each other in its slot.
  """
  dit = merge_dit(dit_def, dit_state)
  p, n, h, w, c = images_PxGxhxwx3.shape
  rows = p * n
  # The reference's operation order: uint8 / 255 in float32, then 2x - 1.
  pixels = (images_PxGxhxwx3.reshape(rows, h, w, c).astype(jnp.float32) / 255.0) * 2.0 - 1.0
  latent_BxCxhxw = sharding_lib.per_device_samples(functools.partial(encode_latents, vae_def), vae_state, pixels)
  # Every image is its own row of one write pass (rows do not interact): row i*n + j holds image j
  # of prompt i, so a prompt's slot is its n rows laid end to end.
  _, cache = dit(latent_BxCxhxw, prior_ids_PxGxX.reshape(rows, -1),
                 jnp.zeros((rows, 0, dit.cfg.text_embed_dim), dit.cfg.dtype), jnp.zeros((rows,)),
                 jnp.tile(jnp.array([[h, w]], jnp.float32), (rows, 1)), jnp.zeros((rows, 2)),
                 kv_cache=None, cache_mode="write")
  layers, _, s, heads, dim = cache.k.shape
  return kvc.DiTKVCache(k=cache.k.reshape(layers, p, n * s, heads, dim),
                        v=cache.v.reshape(layers, p, n * s, heads, dim),
                        valid=cache.valid.reshape(p, n * s))
