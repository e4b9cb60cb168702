"""The GLM-Image pipeline in JAX: prompts (+ condition images) -> AR tokens -> DiT -> VAE -> uint8 images.

Batched over prompts and over samples per prompt (rows of one prompt are consecutive, the
layout `glmrl.grpo.group_advantages` expects), with one PRNG key per sample for the AR
tokens and decoder noise that is either per sample or shared by the samples of a prompt.
Host work (tokenization, positions, glyph texts) happens once per prompt batch; the AR
sampler and the denoise+decode loop are each one compiled program per run (prompts and glyph
tokens are padded to fixed multiples).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from PIL import Image

from glmrl.models.ar import image_processing
from glmrl.models.ar import positions as positions_lib
from glmrl.models.ar.model import merge_image_tokens
from glmrl.models.ar.prompt import PromptBatch, PromptProcessor
from glmrl.models.dit import kv_cache as kvc
from glmrl.models.glm_image import GlmImageConfigs
from glmrl.models.glyph import tokenize_glyph_texts
from glmrl.models.glyph.texts import encode_glyph_embeds
from glmrl.sampling import ar_sampler, decode, scheduler
from glmrl.sampling.logprobs import SamplingConfig


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
  """Static settings of a run."""
  height: int
  width: int
  sampling: SamplingConfig = SamplingConfig()
  dit_steps: int = 50
  guidance_scale: float = 1.5
  share_noise_in_group: bool = True
  prompt_pad: int = 64   # prompt tokens are left-padded to a multiple of this
  glyph_pad: int = 32    # glyph tokens are padded (and masked) to a multiple of this


@dataclasses.dataclass(frozen=True)
class Prepared:
  """Host-side inputs of one prompt batch (one row per prompt)."""
  prompts: tuple[str, ...]
  batch: PromptBatch
  input_ids: np.ndarray       # [P, L] condition-image ids merged in
  positions: np.ndarray       # [3, P, L]
  decode_positions: np.ndarray  # [P, 3, N]
  glyph: object               # GlyphTokens of the prompts
  source_images: tuple | None  # per prompt a uint8 [n, H, W, 3] array (image-to-image)


@dataclasses.dataclass(frozen=True)
class Generated:
  sample: ar_sampler.SampleOutput  # [B, ...] tokens, log-probs, sequences
  images: jax.Array                # [B, H, W, 3] uint8
  latents: jax.Array               # [B, C, H/8, W/8] denoised


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


class GlmImagePipeline:
  """Holds the components (graphdef + params each) and runs generation."""

  def __init__(self, configs: GlmImageConfigs, models: dict, processor: PromptProcessor, glyph_tokenizer,
               spec: PipelineSpec):
    configs.check_consistent()
    self.configs, self.models, self.processor = configs, models, processor
    self.glyph_tokenizer, self.spec = glyph_tokenizer, spec
    sched = scheduler.glm_image_schedule(spec.dit_steps, spec.height, spec.width, configs.scheduler,
                                         vae_scale_factor=configs.vae.scale_factor, patch_size=configs.dit.patch_size)
    self.model_timesteps = jnp.asarray(sched.model_timesteps)
    self.sigmas = jnp.asarray(sched.sigmas)
    self._neg_glyph = None

  # ---------------------------------------------------------------- host side
  def prepare(self, prompts, source_images=None) -> Prepared:
    """Tokenizes prompts, merges condition-image tokens, computes positions and glyph tokens."""
    spec, ar_cfg = self.spec, self.configs.ar
    prompts = tuple(prompts)
    pil_images = None
    if source_images is not None:
      pil_images = [[Image.fromarray(np.asarray(im)) for im in ims] for ims in source_images]
    batch = self.processor(list(prompts), spec.height, spec.width, images=pil_images,
                           pad_to_multiple_of=spec.prompt_pad)
    input_ids = np.asarray(batch.input_ids)
    if input_ids.shape[1] > spec.prompt_pad:
      lengths = batch.valid.sum(axis=1).tolist()
      raise ValueError(f"prompts of {lengths} tokens exceed the fixed prompt length {spec.prompt_pad} "
                       "(config.data.max_prompt_tokens)")
    if batch.pixel_values is not None:
      ar = self.ar_model()
      image_ids = np.asarray(ar.image_tokens(batch.pixel_values, batch.source_grid_thw))
      input_ids = merge_image_tokens(input_ids, image_ids, ar_cfg.image_token_id)
    positions, decode_positions = positions_lib.rope_index(
        input_ids, batch.valid, batch.image_grid_thw, batch.images_per_sample,
        image_start_id=ar_cfg.image_start_token_id, image_end_id=ar_cfg.image_end_token_id)
    glyph = self._glyph_tokens(prompts)
    return Prepared(prompts, batch, input_ids, positions, decode_positions, glyph,
                    None if source_images is None else tuple(np.asarray(s) for s in source_images))

  def _glyph_tokens(self, prompts):
    probe = tokenize_glyph_texts(prompts, self.glyph_tokenizer)
    n_texts, length = probe.input_ids.shape
    seq = probe.gather_mask.shape[1]
    return tokenize_glyph_texts(prompts, self.glyph_tokenizer, pad_texts_to=_round_up(n_texts, len(prompts) * 2),
                                pad_length_to=_round_up(length, self.spec.glyph_pad),
                                pad_seq_to=_round_up(seq, self.spec.glyph_pad))

  # ---------------------------------------------------------------- device side
  def ar_model(self, ar_params=None):
    graphdef, params = self.models["ar"]
    if ar_params is None:
      return nnx.merge(graphdef, params)
    return nnx.merge(graphdef, *ar_params)

  def sample_tokens(self, prepared: Prepared, keys_B, group_size: int, ar_params=None):
    """AR tokens for every prompt x `group_size` samples (`ar_params`: (trainable, frozen) states)."""
    rep = lambda x, axis=0: np.repeat(x, group_size, axis=axis)
    return ar_sampler.generate(
        self.ar_model(ar_params), rep(prepared.input_ids), rep(prepared.batch.valid),
        rep(prepared.positions, axis=1), rep(prepared.decode_positions), keys_B,
        layout=prepared.batch.layout, cfg=self.spec.sampling)

  def glyph_embeddings(self, prepared: Prepared, group_size: int) -> tuple:
    """(glyph, mask, negative glyph, negative mask), each repeated to [B, ...]."""
    graphdef, params = self.models["glyph"]
    if self._neg_glyph is None:
      neg = tokenize_glyph_texts([""], self.glyph_tokenizer)
      self._neg_glyph = (_encode_glyph(graphdef, params, neg), jnp.asarray(neg.gather_mask))
    cond = _encode_glyph(graphdef, params, prepared.glyph)
    p = len(prepared.prompts)
    b = p * group_size
    neg_embeds, neg_mask = self._neg_glyph
    return (jnp.repeat(cond, group_size, axis=0), jnp.repeat(jnp.asarray(prepared.glyph.gather_mask), group_size, 0),
            jnp.broadcast_to(neg_embeds, (b,) + neg_embeds.shape[1:]),
            jnp.broadcast_to(neg_mask, (b,) + neg_mask.shape[1:]))

  def initial_latents(self, key, num_prompts: int, group_size: int):
    """Standard normal latents [B, C, H/8, W/8]; shared within a group when the spec says so."""
    f = self.configs.vae.scale_factor
    shape = (self.configs.dit.in_channels, self.spec.height // f, self.spec.width // f)
    if self.spec.share_noise_in_group:
      return jnp.repeat(jax.random.normal(key, (num_prompts, *shape)), group_size, axis=0)
    return jax.random.normal(key, (num_prompts * group_size, *shape))

  def source_cache(self, prepared: Prepared):
    """Image-to-image: the DiT KV cache of the condition images, one slot per prompt."""
    if prepared.source_images is None:
      return None
    dit_def, dit_params = self.models["dit"]
    vae_def, vae_params = self.models["vae"]
    ar = self.ar_model()
    slots = []
    for images in prepared.source_images:
      cache = None
      for image in images:
        prior = _source_prior_tokens(ar, self.processor, image)
        cache = _write_source(dit_def, dit_params, vae_def, vae_params, jnp.asarray(image)[None], prior, cache)
      slots.append(cache)
    return kvc.stack_slots(slots)

  def decode_tokens(self, prepared: Prepared, target_BxHxW, latents, group_size: int, source_cache=None):
    """Denoise from `latents` conditioned on the target-grid tokens and decode: (uint8 images, latents)."""
    glyph, mask, neg, neg_mask = self.glyph_embeddings(prepared, group_size)
    cond = decode.Conditioning(decode.upsample_prior_tokens(target_BxHxW), glyph, mask, neg, neg_mask)
    b = target_BxHxW.shape[0]
    target_size = jnp.tile(jnp.array([[self.spec.height, self.spec.width]], jnp.float32), (b, 1))
    dit_def, dit_params = self.models["dit"]
    vae_def, vae_params = self.models["vae"]
    return decode.denoise_and_decode(dit_def, dit_params, vae_def, vae_params, cond, latents,
                                     self.model_timesteps, self.sigmas, self.spec.guidance_scale, target_size,
                                     jnp.zeros((b, 2), jnp.float32), source_cache)

  def __call__(self, prompts, key, samples_per_prompt: int = 1, source_images=None, ar_params=None) -> Generated:
    prepared = self.prepare(prompts, source_images)
    token_key, noise_key = jax.random.split(key)
    b = len(prepared.prompts) * samples_per_prompt
    sample = self.sample_tokens(prepared, jax.random.split(token_key, b), samples_per_prompt, ar_params)
    latents = self.initial_latents(noise_key, len(prepared.prompts), samples_per_prompt)
    images, latents = self.decode_tokens(prepared, sample.target, latents, samples_per_prompt,
                                         self.source_cache(prepared))
    return Generated(sample, images, latents)


def _encode_glyph(graphdef, params, tokens):
  return _encode_glyph_fn(graphdef)(params, tokens)


_GLYPH_FNS = {}


def _encode_glyph_fn(graphdef):
  if graphdef not in _GLYPH_FNS:
    _GLYPH_FNS[graphdef] = jax.jit(lambda params, tokens: encode_glyph_embeds(nnx.merge(graphdef, params), tokens))
  return _GLYPH_FNS[graphdef]


def _source_prior_tokens(ar, processor: PromptProcessor, image) -> jax.Array:
  """The condition image's VQ tokens on the AR grid, upsampled to the DiT patch grid: [1, N]."""
  pixel_values, grid_thw = image_processing.preprocess([Image.fromarray(np.asarray(image))], processor.image_cfg)
  ids = ar.image_tokens(pixel_values, grid_thw)
  return decode.upsample_prior_tokens(ids.reshape(1, int(grid_thw[0, 1]), int(grid_thw[0, 2])))


def _write_source(dit_def, dit_params, vae_def, vae_params, image_1xHxWx3, prior_1xN, cache):
  """VAE-encodes one condition image and runs the DiT's cache-writing pass over it."""
  vae = nnx.merge(vae_def, vae_params)
  dit = nnx.merge(dit_def, dit_params)
  pixels = image_1xHxWx3.astype(jnp.float32) / 127.5 - 1.0
  latent = jnp.transpose(vae.encode_normalized(pixels), (0, 3, 1, 2))
  h, w = image_1xHxWx3.shape[1:3]
  empty_glyph = jnp.zeros((1, 0, dit.cfg.text_embed_dim), dit.cfg.dtype)
  _, cache = dit(latent, prior_1xN, empty_glyph, jnp.zeros((1,)), jnp.array([[h, w]], jnp.float32),
                 jnp.zeros((1, 2)), kv_cache=cache, cache_mode="write")
  return cache
