"""What every policy on the DiT shares (config.train.policies' "decoder", config.decoder): its settings, its
checkpoint names, the rollout it asks for (`decoder.group_size` samples of each token grid, decoded by its own
rollout leg at `decoder.train_steps` steps and the training guidance), its rows and rewards, and the one
update body over the one micro-batch x step accumulation (`glmrl.policy.accumulate.scan_steps`).

The algorithms: Flow-GRPO (`flow_grpo.py`), DiffusionNFT (`nft.py`) and AWM (`awm.py`), the last two over the
forward-process helpers of `dit_matching.py`.
"""

from __future__ import annotations

import abc
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.policy import accumulate
from glmrl.policy import ema as ema_lib
from glmrl.policy.base import BoundPolicy, FlopCounts, Request, Saved, Settings, lora_settings
from glmrl.sampling import gaussian

# The DiT's trained state is its own item of each step, with the DiT's paths (a converted
# `transformer/params`): the whole DiT, or with DiT LoRA its adapters only, whose settings and base are recorded
# in decoder_lora.json; dit_config.json is the trained DiT's diffusers `transformer/config.json` dict, for an
# export without a source folder.
SAVED = Saved(params="decoder_params", opt_state="decoder_opt_state", ema="decoder_ema",
              adapters_file="decoder_lora.json", model_config_file="dit_config.json",
              lora_section="config.decoder.lora", role="decoder", export_component="transformer")


def settings_of(config) -> Settings:
  """The DiT policy's settings from config.decoder."""
  d = config.decoder
  return Settings(lora=lora_settings(d.lora), optim=d.optim, num_iterations=d.num_iterations, beta=float(d.beta),
                  micro_batch_size=d.micro_batch_size,
                  ema=ema_lib.EmaSettings(decay=float(d.ema.decay), every=d.ema.every, ramp=float(d.ema.ramp),
                                         flat=d.ema.flat, after=d.ema.after),
                  advantage_scale=d.adv_std)


def train_guidance(config) -> float:
  """The CFG scale of the DiT policy's rollouts and loss: config.decoder.train_guidance, unset (0) the sampling
  scale; 1.0 is CFG-free (one DiT pass per step)."""
  return float(config.decoder.train_guidance or config.sampling.guidance_scale)


def loss_guidance(config) -> float:
  """The CFG scale of the DiT policy's loss: config.decoder.loss_guidance, unset (0) the rollout's
  (`train_guidance`)."""
  return float(config.decoder.loss_guidance or train_guidance(config))


def decoder_noise(run, key, num_prompts: int):
  """(initial latents [B, C, h, w], noise keys [B]) of a DiT-policy rollout.

  Shared within a prompt's token grids when `sampling.share_noise_in_group` (the AR groups then differ only by
  their tokens, as in an "ar" run), distinct across a grid's decoder samples always (the decoder groups differ
  only by the decoder's noise)."""
  request = run.request
  ga, gd = request.grids_per_prompt, request.samples_per_grid
  share = run.config.sampling.share_noise_in_group
  row_B = np.arange(num_prompts * ga * gd)
  source_B = (row_B // (ga * gd)) * gd + row_B % gd if share else row_B
  draws = num_prompts * (gd if share else ga * gd)
  latent_key, sde_key = jax.random.split(key)
  latents = run.pipeline.shard_batch(gaussian.normal(latent_key, (draws, *run.pipeline.latent_shape))[source_B])
  return latents, jax.random.split(sde_key, draws)[source_B]


def update(accumulate_gradients, graphdef, params, frozen, opt_state, batch, anchors=None, first=True, *, spec, tx,
           schedule):
  """One optimizer step of a DiT policy: `accumulate_gradients(graphdef, params, frozen, batch, anchors, first,
  spec=spec)` gives (summed float32 gradient, statistics, the first update's outputs); every (sample, step) in the
  loss counts once, so the statistics' means are over the denominator. Returns (params, opt_state, metrics,
  outputs). A non-finite loss or gradient leaves params and optimizer state untouched (`skipped = 1`)."""
  grads_sum, stats, outputs = accumulate_gradients(graphdef, params, frozen, batch, anchors, first, spec=spec)
  new_params, new_opt_state, metrics = accumulate.apply(tx, schedule, params, opt_state, grads_sum, stats,
                                                        jnp.maximum(stats["denominator"], 1.0))
  return new_params, new_opt_state, metrics, outputs


class DitPolicy(BoundPolicy, abc.ABC):
  """A policy on the DiT, bound to the run's config: groups of one token grid's samples, one row per image.
  Subclasses give the rollout leg, the batch, the update and the trained steps."""
  name = "decoder"
  component = "dit"
  saved = SAVED
  salt = 0xD17
  full_filter = nnx.Param
  micro_batch_key = "config.decoder.micro_batch_size"
  programs = ("decoder_rewards", "decoder_update")
  rewards_key = "decoder.rewards"
  decodes = True

  def __init__(self, config):
    super().__init__(config)
    self.settings = settings_of(config)
    self.request = Request(samples_per_grid=config.decoder.group_size)
    self.train_steps = config.decoder.train_steps   # denoising steps of its rollouts
    self.guidance = train_guidance(config)           # CFG scale of its rollouts
    # The CFG scale of its loss's velocities: its rollouts' (Flow-GRPO's loss is its rollout's own steps' log-prob);
    # the forward-process policies read decoder.loss_guidance (`glmrl.policy.dit_matching`).
    self.loss_guidance = self.guidance

  def rows_per_prompt(self, request: Request) -> int:
    """Rows of its update per prompt: one per image."""
    return request.images_per_prompt

  def rewards(self, request: Request) -> tuple:
    """(its reward entries, the rows a per-group normalisation spans: a token grid's samples)."""
    return self.config.decoder.rewards, request.samples_per_grid

  def prefix(self, policies) -> str:
    del policies
    return "decoder/"

  def group_rewards(self, total_B, request: Request):
    return total_B, request.samples_per_grid

  def leg_inputs(self, run, prepared, sample, key) -> tuple:
    """(token grids [B, ...], initial latents [B, C, h, w], noise keys [B], conditioning) of its rollout leg: every
    grid decoded `samples_per_grid` times; the glyph encoder runs once, for the sampler and the update alike."""
    pipeline, request = run.pipeline, run.request
    target_B = pipeline.shard_batch(jnp.repeat(sample.target, request.samples_per_grid, axis=0))
    latents, noise_keys_B = decoder_noise(run, key, len(prepared.prompts))
    return target_B, latents, noise_keys_B, pipeline.conditioning(prepared, target_B, request.images_per_prompt)

  def decode(self, run, prepared, target_B, latents, cond, dit_params, **kw):
    """The pipeline's decode of its rollout leg: its training steps and guidance."""
    return run.pipeline.decode_tokens(prepared, target_B, latents, run.request.images_per_prompt,
                                      dit_params=dit_params, steps=self.train_steps, conditioning=cond,
                                      guidance_scale=self.guidance, **kw)

  @staticmethod
  def rows(pipeline, cond) -> dict:
    """The update's per-row conditioning from the leg's, sharded as the batch."""
    return dict(cond=jax.tree.map(pipeline.shard_batch, cond.dit), target_size=pipeline.shard_batch(cond.target_size),
                crop=pipeline.shard_batch(cond.crop))

  def abstract_rows(self, run, rows: int) -> dict:
    """`rows` as ShapeDtypeStructs (`--mode=compile`)."""
    return dict(cond=run.abstract_conditioning(rows), target_size=run.batch_array((rows, 2), jnp.float32),
                crop=run.batch_array((rows, 2), jnp.float32))

  def abstract_leg(self, run, chunk: int) -> tuple:
    """What its rollout leg adds to the decode program's arguments for a chunk of `chunk` images (none)."""
    del run, chunk
    return ()

  def make_update(self, state, shape):
    images, = shape
    return state.jit_update(self.update, self.spec(images))

  @abc.abstractmethod
  def trained_steps(self) -> int:
    """Denoising steps its update trains per image."""

  @abc.abstractmethod
  def anchor_passes(self, images: int) -> int:
    """DiT forwards its update on `images` rows adds per trained step beside its own (the KL reference's, the
    moving average's)."""

  def update_flops(self, counts: FlopCounts) -> float:
    """Per trained step and image the guided forward (one branch at loss guidance 1.0), a backward of 2x it (2x
    more with weight gradients of the whole DiT) and its anchors' forwards."""
    train_pass = counts.dit_pass * (1 if self.loss_guidance == 1.0 else 2)
    passes = 1 + (2 if self.settings.lora.enabled else 4) + self.anchor_passes(counts.images)
    return float(self.settings.num_iterations * counts.images * self.trained_steps() * train_pass * passes)
