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
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct
from PIL import Image

from glmrl import sharding as sharding_lib
from glmrl.errors import UserError
from glmrl.models.ar import image_processing
from glmrl.models.ar import positions as positions_lib
from glmrl.models.ar.model import merge_image_tokens
from glmrl.models.ar.prompt import PromptProcessor, TokenizedPrompts
from glmrl.models.glm_image import GlmImageConfigs
from glmrl.models.glyph import tokenize_glyph_texts
from glmrl.models.glyph.texts import encode_glyph_embeds, extract_glyph_texts
from glmrl.sampling import ar_sampler, decode, gaussian, rollout_weights, scheduler
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
  glyph_pad: int = 32    # glyph tokens per prompt (all its quoted texts), fixed: one DiT program per run
  glyph_texts: int = 4   # quoted texts per prompt in the glyph encoder's fixed batch
  decode_batch: int = 0  # samples per denoise+decode call (bounds its activations); 0, -1: see `decode_chunk`
  ar_weights: str = "update"  # the AR sampler's weight layout (`sharding.ROLLOUT_WEIGHTS`)

  def __post_init__(self):
    for name in ("height", "width"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0 or value % 32:
        raise ValueError(f"PipelineSpec.{name}={value!r} must be a positive multiple of 32 (one AR token per 32 px)")
    for name in ("dit_steps", "prompt_pad", "glyph_pad", "glyph_texts", "decode_batch"):
      value = getattr(self, name)
      low = -1 if name == "decode_batch" else 1
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"PipelineSpec.{name}={value!r} must be an integer >= {low}")


@dataclasses.dataclass(frozen=True)
class Prepared:
  """Host-side inputs of one prompt batch (one row per prompt)."""
  prompts: tuple[str, ...]
  batch: TokenizedPrompts
  input_ids: np.ndarray       # [P, L] condition-image ids merged in
  positions: np.ndarray       # [3, P, L]
  decode_positions: np.ndarray  # [P, 3, N]
  glyph: object               # GlyphTokens of the prompts
  source_images: np.ndarray | None = None  # uint8 [P, n, H, W, 3] condition images (image-to-image)
  source_ids: np.ndarray | None = None     # int32 [P, n, H/32, W/32] their AR VQ token grids


@struct.dataclass
class Conditioned:
  """The DiT conditioning of a batch's rows and their target sizes and crops ([B, 2] each)."""
  dit: decode.Conditioning
  target_size: jax.Array
  crop: jax.Array


@dataclasses.dataclass(frozen=True)
class SdeRequest:
  """Flow-GRPO's SDE window in a decode (`decode.denoise`): its shape, its first step (traced) and one
  noise key per row."""
  window: decode.SdeWindow
  start: jax.Array
  noise_keys_B: jax.Array


@dataclasses.dataclass(frozen=True)
class Generated:
  sample: ar_sampler.SampleOutput  # [B, ...] tokens, log-probs, sequences
  images: jax.Array                # [B, H, W, 3] uint8
  latents: jax.Array               # [B, C, H/8, W/8] denoised


def check_prompts(prompts) -> tuple[str, ...]:
  """The prompts as a tuple; ValueError for an empty batch or a prompt without text."""
  if isinstance(prompts, str):
    raise ValueError(f"prompts must be a sequence of strings, got the single string {prompts!r:.100}")
  prompts = tuple(prompts)
  if not prompts:
    raise ValueError("the prompt batch is empty")
  for i, p in enumerate(prompts):
    if not isinstance(p, str):
      raise ValueError(f"prompt {i} is a {type(p).__name__} ({p!r:.100}), not a string")
    if not p.strip():
      raise ValueError(f"prompt {i} is {p!r}: every prompt needs text")
  return prompts


def check_source_images(source_images, num_prompts: int, height: int, width: int) -> np.ndarray:
  """Condition images per prompt -> uint8 [P, n, height, width, 3]; ValueError naming what is wrong.

  Each image is a uint8 [H, W, 3] array or a PIL image in mode RGB, of exactly the target size
  (the decoder's cache-writing pass and the AR grid assume it); every prompt has n >= 1 of them.
  """
  if isinstance(source_images, (np.ndarray, Image.Image)) and np.ndim(source_images) < 4:
    raise ValueError("source_images must hold one sequence of condition images per prompt, got a single image")
  lists = [list(ims) for ims in source_images]
  if len(lists) != num_prompts:
    raise ValueError(f"{len(lists)} condition-image lists for {num_prompts} prompts")
  counts = [len(ims) for ims in lists]
  if len(set(counts)) != 1 or counts[0] == 0:
    raise ValueError(f"every prompt needs the same number (>= 1) of condition images, got {counts} per prompt")
  out = np.empty((num_prompts, counts[0], height, width, 3), np.uint8)
  for i, ims in enumerate(lists):
    for j, im in enumerate(ims):
      where = f"condition image {j} of prompt {i}"
      if isinstance(im, Image.Image):
        if im.mode != "RGB":
          raise ValueError(f"{where} has PIL mode {im.mode!r}; convert it to 'RGB'")
        im = np.asarray(im)
      elif not isinstance(im, np.ndarray):
        raise ValueError(f"{where} is a {type(im).__name__}; expected a uint8 [H, W, 3] array or a PIL RGB image")
      if im.dtype != np.uint8 or im.ndim != 3 or im.shape[-1] != 3:
        raise ValueError(f"{where} is {im.dtype} {im.shape}; expected uint8 [H, W, 3] RGB")
      h, w = im.shape[:2]
      if h % 32 or w % 32:
        raise ValueError(f"{where} is {h}x{w}; its sides must be multiples of 32")
      if (h, w) != (height, width):
        raise ValueError(f"{where} is {h}x{w} but the run generates {height}x{width}; condition images "
                         "must have the target size")
      out[i, j] = im
  return out


def _glyph_sizes(prompt: str, tokenizer) -> tuple[int, int]:
  """(quoted texts, glyph tokens) of one prompt, as the pipeline tokenizes it."""
  glyph = tokenize_glyph_texts([prompt], tokenizer)
  return int(glyph.text_counts[0]), int(glyph.lengths[0])


def check_glyph_fits(prompts: Sequence[tuple[str, str]], tokenizer, max_tokens: int, max_texts: int) -> None:
  """UserError naming the first of the (prompt, where) pairs whose quoted texts exceed the run's fixed glyph sizes,
  with how many do and the value of the setting that fits them all."""
  sizes = [_glyph_sizes(prompt, tokenizer) for prompt, _ in prompts]
  for index, (limit, key) in enumerate(((max_texts, "max_glyph_texts"), (max_tokens, "max_glyph_tokens"))):
    over = [i for i, size in enumerate(sizes) if size[index] > limit]
    if not over:
      continue
    prompt, where = prompts[over[0]]
    n = sizes[over[0]][index]
    # GLM-Image's pipeline (diffusers' get_glyph_texts) draws every '...', “...”, "..." and 「...」 span, so
    # two apostrophes make one: the message shows what was found.
    texts = extract_glyph_texts(prompt)
    found = ", ".join(repr(t if len(t) <= 40 else t[:37] + "...") for t in texts[:4])
    why = (f" (found {found}{', ...' if len(texts) > 4 else ''}; GLM-Image draws every span in '', “”, \"\" or "
           "「」, apostrophes included)")
    what = f"{n} quoted texts, more than" if index == 0 else f"its quoted texts take {n} glyph tokens, more than"
    fits = max(sizes[i][index] for i in over)
    count = f"{len(over)} of {len(prompts)} prompts exceed it; " if len(prompts) > 1 else ""
    raise UserError(f"{where}: {what} config.data.{key}={limit}{why}; {count}--config.data.{key}={fits} fits "
                    f"{'them all' if count else 'it'}")


def _fits(chunk: int, batch: int, group_size: int) -> bool:
  return batch % chunk == 0 and (chunk % group_size == 0 or group_size % chunk == 0)


def check_decode_batch(chunk: int, batch: int, group_size: int) -> None:
  """Decoder chunks divide the batch and read whole condition-image slots (one per group)."""
  if not _fits(chunk, batch, group_size):
    raise UserError(f"config.sampling.decode_batch={chunk} must divide the batch of {batch} samples and divide or "
                    f"be a multiple of the group size {group_size} (a chunk reads whole condition-image slots)")


def decode_chunk(requested: int, batch: int, group_size: int, devices: int) -> int:
  """Samples per decoder call: `requested` when it is set (checked); -1: the whole batch; 0: the smallest chunk
  that divides the batch, reads whole condition-image slots and splits evenly over the `devices` of the mesh's
  batch axes (one sample per device per call: the least decoder memory at full use of the chips), or the whole
  batch when none does."""
  if requested == -1:
    return batch
  if requested:
    check_decode_batch(requested, batch, group_size)
    return requested
  return next((c for c in range(devices, batch + 1, devices) if _fits(c, batch, group_size)), batch)


class GlmImagePipeline:
  """Holds the components (graphdef + params each) and runs generation."""

  def __init__(self, configs: GlmImageConfigs, models: dict, processor: PromptProcessor, glyph_tokenizer,
               spec: PipelineSpec, mesh=None):
    configs.check_consistent()
    self.configs, self.models, self.processor = configs, models, processor
    self.mesh = mesh
    self.glyph_tokenizer, self.spec = glyph_tokenizer, spec
    self._schedules = {}
    self.model_timesteps, self.sigmas = self.schedule(spec.dit_steps)
    self._neg_glyph = None
    self._own_ar_rollout = None  # the pipeline's own AR weights in the sampler's layout, placed once
    self._ar_reshard = {}

  def schedule(self, steps: int) -> tuple[jax.Array, jax.Array]:
    """(model timesteps [S], sigmas [S + 1]) of the reference schedule with `steps` denoising steps."""
    if steps not in self._schedules:
      c = self.configs
      sched = scheduler.glm_image_schedule(steps, self.spec.height, self.spec.width, c.scheduler,
                                           vae_scale_factor=c.vae.scale_factor, patch_size=c.dit.patch_size)
      self._schedules[steps] = (jnp.asarray(sched.model_timesteps), jnp.asarray(sched.sigmas))
    return self._schedules[steps]

  # ---------------------------------------------------------------- host side
  def prepare(self, prompts, source_images=None, ar_params=None) -> Prepared:
    """Tokenizes prompts, merges condition-image tokens, computes positions and glyph tokens.

    `source_images[i]`: the condition images of prompt i (image-to-image), each uint8 [H, W, 3]
    RGB (or a PIL RGB image) of the run's size; every prompt has the same number of them.
    `ar_params`: the AR states whose vision encoder and VQ tokenize them (see `ar_model`).
    """
    spec, ar_cfg = self.spec, self.configs.ar
    prompts = check_prompts(prompts)
    sources = None
    pil_images = None
    if source_images is not None:
      sources = check_source_images(source_images, len(prompts), spec.height, spec.width)
      self._check_source_grid()
      pil_images = [[Image.fromarray(im) for im in ims] for ims in sources]
    batch = self.processor(list(prompts), spec.height, spec.width, images=pil_images,
                           pad_to_multiple_of=spec.prompt_pad)
    input_ids = np.asarray(batch.input_ids)
    if input_ids.shape[1] > spec.prompt_pad:
      lengths = batch.valid.sum(axis=1).tolist()
      raise UserError(f"prompts of {lengths} tokens exceed the fixed prompt length {spec.prompt_pad} "
                       "(config.data.max_prompt_tokens)")
    source_ids = None
    if batch.pixel_values is not None:
      ar = self.ar_model(ar_params)
      image_ids = np.asarray(ar.image_tokens(batch.pixel_values, batch.source_grid_thw))
      input_ids = merge_image_tokens(input_ids, image_ids, ar_cfg.image_token_id)
      source_ids = image_ids.reshape(*sources.shape[:2], spec.height // 32, spec.width // 32)
    positions, decode_positions = positions_lib.rope_index(
        input_ids, batch.valid, batch.image_grid_thw, batch.images_per_sample,
        image_start_id=ar_cfg.image_start_token_id, image_end_id=ar_cfg.image_end_token_id)
    glyph = self._glyph_tokens(prompts)
    return Prepared(prompts, batch, input_ids, positions, decode_positions, glyph, sources, source_ids)

  def _check_source_grid(self) -> None:
    """The AR processor must tokenize a condition image onto the target's 32 px grid, which the
    decoder reads upsampled x2 next to the image's latents."""
    cfg, h, w = self.processor.image_cfg, self.spec.height, self.spec.width
    if cfg.do_resize:
      rh, rw = image_processing.smart_resize(h, w, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    else:
      rh, rw = h, w
    grid = (rh // cfg.patch_size, rw // cfg.patch_size)
    if grid != (h // 32, w // 32) or cfg.merge_size != 1 or cfg.temporal_patch_size != 1:
      raise ValueError(
          f"the AR image processor (patch_size={cfg.patch_size}, merge_size={cfg.merge_size}, temporal_patch_size="
          f"{cfg.temporal_patch_size}, min_pixels={cfg.min_pixels}, max_pixels={cfg.max_pixels}) tokenizes a "
          f"{h}x{w} condition image into a {grid[0]}x{grid[1]} grid, but image-to-image needs the "
          f"{h // 32}x{w // 32} grid of one token per 32 px")

  def _glyph_tokens(self, prompts):
    """Glyph tokens padded to the spec's fixed sizes, so a long quoted text never recompiles the DiT loop."""
    try:
      return tokenize_glyph_texts(prompts, self.glyph_tokenizer, pad_texts_to=len(prompts) * self.spec.glyph_texts,
                                  pad_length_to=self.spec.glyph_pad, pad_seq_to=self.spec.glyph_pad)
    except ValueError:
      check_glyph_fits([(prompt, f"prompt {i}") for i, prompt in enumerate(prompts)], self.glyph_tokenizer,
                       self.spec.glyph_pad, self.spec.glyph_texts)  # names the prompt that does not fit
      raise

  # ---------------------------------------------------------------- device side
  def ar_model(self, ar_params=None):
    """The AR model on `ar_params` (a tuple of states, e.g. (trainable, frozen)), else on the pipeline's own.

    A training run builds its pipeline without AR parameters (`models["ar"] = (graphdef, None)`): the
    Trainer owns them and the update donates them, so every call passes the current ones.
    """
    graphdef, params = self.models["ar"]
    if ar_params is not None:
      return nnx.merge(graphdef, *ar_params)
    if params is None:
      raise ValueError("this pipeline holds no AR parameters (a training run owns them): pass ar_params")
    return nnx.merge(graphdef, params)

  @property
  def batch_devices(self) -> int:
    """Devices the batch axis splits over: the mesh's data x fsdp."""
    return 1 if self.mesh is None else sharding_lib.batch_devices(self.mesh)

  def shard_batch(self, x, batch_axis: int = 0):
    """Places a [.., B, ..] array with its batch axis split over the mesh's data x fsdp axes."""
    if self.mesh is None:
      return jnp.asarray(x)
    spec = [None] * np.ndim(x)
    spec[batch_axis] = sharding_lib.BATCH_AXES
    return sharding_lib.put(x, jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*spec)))

  def rollout_ar_params(self, ar_params=None):
    """The AR states the sampler reads: `ar_params` (default the pipeline's own) as they are, or with
    spec.ar_weights "gathered" cast to the compute dtype and resharded without their fsdp split
    (`rollout_weights`; once per call, the pipeline's own once)."""
    if self.spec.ar_weights == "update" or self.mesh is None:
      return ar_params
    if ar_params is None:
      if self._own_ar_rollout is None:
        self._own_ar_rollout = self.rollout_ar_params((self.models["ar"][1],))
      return self._own_ar_rollout
    structure = jax.tree.structure(ar_params)
    if structure not in self._ar_reshard:  # one reshard per tree: a run's shardings do not change
      self._ar_reshard[structure] = rollout_weights.Reshard(ar_params, self.configs.ar.dtype)
    return self._ar_reshard[structure](ar_params)

  def sample_tokens(self, prepared: Prepared, keys_B, group_size: int, ar_params=None):
    """AR tokens for every prompt x `group_size` samples (`ar_params`: (trainable, frozen) states), the weights
    in the spec's rollout layout (`rollout_ar_params`)."""
    rep = lambda x, axis=0: self.shard_batch(np.repeat(x, group_size, axis=axis), axis)
    model = self.ar_model(self.rollout_ar_params(ar_params))
    with sharding_lib.use_mesh(self.mesh):
      return ar_sampler.sample_ids(
          model, rep(prepared.input_ids), rep(prepared.batch.valid),
          rep(prepared.positions, axis=1), rep(prepared.decode_positions), self.shard_batch(keys_B),
          layout=prepared.batch.layout, cfg=self.spec.sampling)

  def glyph_embeddings(self, prepared: Prepared, group_size: int) -> tuple:
    """(glyph, mask, negative glyph, negative mask), each repeated to [B, ...]."""
    graphdef, params = self.models["glyph"]
    if self._neg_glyph is None:
      neg = tokenize_glyph_texts([""], self.glyph_tokenizer)
      self._neg_glyph = (_encode_glyph(graphdef, params, neg), jnp.asarray(neg.gather_mask))
    cond = _encode_glyph(graphdef, params, prepared.glyph)
    return _repeat_glyphs(cond, prepared.glyph.gather_mask, *self._neg_glyph, group_size=group_size)

  @property
  def latent_shape(self) -> tuple[int, int, int]:
    """(C, h, w) of one sample's latents."""
    return self.configs.latent_shape(self.spec.height, self.spec.width)

  def initial_latents(self, key, num_prompts: int, group_size: int):
    """Standard normal latents [B, C, H/8, W/8]; shared within a group when the spec says so."""
    shape = self.latent_shape
    if self.spec.share_noise_in_group:
      return self.shard_batch(jnp.repeat(gaussian.normal(key, (num_prompts, *shape)), group_size, axis=0))
    return self.shard_batch(gaussian.normal(key, (num_prompts * group_size, *shape)))

  def source_cache(self, prepared: Prepared, dit_params=None):
    """Image-to-image: the DiT KV cache of the condition images, one slot per prompt (None for t2i)."""
    if prepared.source_images is None:
      return None
    p, n, th, tw = prepared.source_ids.shape
    prior_PxGxX = decode.upsample_prior_tokens(jnp.asarray(prepared.source_ids).reshape(p * n, th, tw))
    dit_def, dit_params = self.models["dit"][0], self.dit_params(dit_params)
    vae_def, vae_params = self.models["vae"]
    with sharding_lib.use_mesh(self.mesh):
      return decode.write_source_cache(dit_def, dit_params, vae_def, vae_params,
                                       jnp.asarray(prepared.source_images), prior_PxGxX.reshape(p, n, -1))

  def conditioning(self, prepared: Prepared, target_Bxhxw, group_size: int) -> Conditioned:
    """The DiT conditioning, target sizes and crops of `group_size` rows per prompt."""
    return _conditioned(target_Bxhxw, self.glyph_embeddings(prepared, group_size),
                        size=(self.spec.height, self.spec.width))

  def dit_params(self, dit_params=None):
    """`dit_params` (a state or a tuple of states, e.g. (adapters, base)) or the pipeline's own DiT state."""
    if dit_params is not None:
      return dit_params
    if self.models["dit"][1] is None:
      raise ValueError("this pipeline holds no DiT parameters (a decoder RL run owns them): pass dit_params")
    return self.models["dit"][1]

  def decode_tokens(self, prepared: Prepared, target_Bxhxw, latents, group_size: int, source_cache=None, *,
                    dit_params=None, steps: int | None = None, sde: SdeRequest | None = None,
                    conditioning: Conditioned | None = None, guidance_scale: float | None = None, on_images=None):
    """Denoise from `latents` conditioned on the target-grid tokens and decode: (uint8 images, latents),
    and the SDE window's `decode.Trajectory` ([W, B, ...]) when `sde` is given.

    `group_size`: rows per prompt. `steps`: denoising steps (default the spec's `dit_steps`); `guidance_scale`
    likewise (default the spec's; 1.0 runs one DiT pass per step).
    `conditioning`: `self.conditioning(prepared, target_Bxhxw, group_size)` when the caller already has it.
    The batch is decoded in chunks of `spec.decode_batch` samples by one compiled program (the
    attention of a 1024^2 DiT step over a whole rollout would not fit); rows do not interact, so the
    result is the whole batch's. Each chunk is re-spread over the mesh's batch axes. `on_images(first, images)` is
    called with each chunk's images (rows `first`...) as soon as that chunk is dispatched, before the next one is
    (`glmrl.train.reward_stream` scores them while the device decodes on).
    """
    cond = conditioning or self.conditioning(prepared, target_Bxhxw, group_size)
    b = target_Bxhxw.shape[0]
    # A run checks its batches before building models (`glmrl.programs.plan.check_batch`).
    chunk = decode_chunk(self.spec.decode_batch, b, group_size, self.batch_devices)
    dit_def = self.models["dit"][0]
    dit_params = self.dit_params(dit_params)
    vae_def, vae_params = self.models["vae"]
    timesteps, sigmas = self.schedule(steps or self.spec.dit_steps)
    guidance = float(self.spec.guidance_scale if guidance_scale is None else guidance_scale)
    window, start = (sde.window, sde.start) if sde is not None else (None, 0)

    def run(cond: Conditioned, latents, cache, keys):
      with sharding_lib.use_mesh(self.mesh):
        return decode.denoise_and_decode(dit_def, dit_params, vae_def, vae_params, cond.dit, latents,
                                         timesteps, sigmas, guidance, cond.target_size, cond.crop,
                                         cache, window, keys, start)

    keys_B = None if sde is None else sde.noise_keys_B
    if chunk == b:
      out = run(cond, latents, source_cache, keys_B)
      if on_images is not None:
        on_images(0, out[0])
      return out
    outs = []
    for first in range(0, b, chunk):
      part = lambda x: self.shard_batch(x[first:first + chunk])
      cache = None
      if source_cache is not None:  # slot i serves the group_size rows of prompt i
        lo, hi = first // group_size, -(-(first + chunk) // group_size)
        cache = source_cache._replace(k=source_cache.k[:, lo:hi], v=source_cache.v[:, lo:hi],
                                      valid=source_cache.valid[lo:hi])
      keys = None if keys_B is None else keys_B[first:first + chunk]
      outs.append(run(jax.tree.map(part, cond), part(latents), cache, keys))
      if on_images is not None:
        on_images(first, outs[-1][0])
    images, out_latents = jnp.concatenate([o[0] for o in outs]), jnp.concatenate([o[1] for o in outs])
    if sde is None:
      return images, out_latents
    trajectory = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *[o[2] for o in outs])
    return images, out_latents, trajectory

  def __call__(self, prompts, key, samples_per_prompt: int = 1, source_images=None, ar_params=None,
               dit_params=None) -> Generated:
    if isinstance(samples_per_prompt, bool) or not isinstance(samples_per_prompt, (int, np.integer)) \
        or samples_per_prompt < 1:
      raise ValueError(f"samples_per_prompt={samples_per_prompt!r} must be a positive integer")
    prepared = self.prepare(prompts, source_images, ar_params)
    token_key, noise_key = jax.random.split(key)
    b = len(prepared.prompts) * samples_per_prompt
    sample = self.sample_tokens(prepared, jax.random.split(token_key, b), samples_per_prompt, ar_params)
    latents = self.initial_latents(noise_key, len(prepared.prompts), samples_per_prompt)
    images, latents = self.decode_tokens(prepared, sample.target, latents, samples_per_prompt,
                                         self.source_cache(prepared, dit_params), dit_params=dit_params)
    return Generated(sample, images, latents)


@functools.partial(jax.jit, static_argnums=0)
def _encode_glyph(graphdef, params, tokens):
  return encode_glyph_embeds(nnx.merge(graphdef, params), tokens)


# The conditioning's repeats and broadcasts as one program each (op by op, each was its own).
@functools.partial(jax.jit, static_argnames=("group_size",))
def _repeat_glyphs(glyph_PxSxD, mask_PxS, neg_1xSxD, neg_mask_1xS, *, group_size: int) -> tuple:
  b = glyph_PxSxD.shape[0] * group_size
  return (jnp.repeat(glyph_PxSxD, group_size, axis=0), jnp.repeat(mask_PxS, group_size, axis=0),
          jnp.broadcast_to(neg_1xSxD, (b,) + neg_1xSxD.shape[1:]),
          jnp.broadcast_to(neg_mask_1xS, (b,) + neg_mask_1xS.shape[1:]))


@functools.partial(jax.jit, static_argnames=("size",))
def _conditioned(target_Bxhxw, glyphs: tuple, *, size: tuple[int, int]) -> Conditioned:
  b = target_Bxhxw.shape[0]
  cond = decode.Conditioning(decode.upsample_prior_tokens(target_Bxhxw), *glyphs)
  return Conditioned(cond, jnp.tile(jnp.array([size], jnp.float32), (b, 1)), jnp.zeros((b, 2), jnp.float32))
