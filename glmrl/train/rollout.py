"""One GRPO rollout: sample groups of images, score them, and turn the scores into advantages.

Everything stays on device between the sampler, the decoder, pure-JAX rewards and the advantages;
only host-side rewards (e.g. JPEG size) fetch the images. Scoring is `RewardComposer.score`, the
path evaluation takes too. The learner's old log-probs are not
computed here: the first update computes them (`glmrl.train.step`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from glmrl import grpo
from glmrl.sampling import decode
from glmrl.train import decoder_step
from glmrl.train import step as step_lib


@functools.partial(jax.jit, static_argnames=("group_size", "scale", "estimator", "std_eps", "drop_constant"))
def advantage_stats(total_B, *, group_size, scale, estimator, std_eps, drop_constant):
  """Total rewards [B] -> (advantages [B], row mask [B], zero-variance group fraction).

  "Zero variance" is `grpo.constant_groups` with the run's threshold (config.grpo.std_eps, which
  the per-reward normalisation uses too): the groups whose advantages are exactly 0, and the ones
  `drop_constant` removes from the loss.
  """
  advantages_B = grpo.group_advantages(total_B, group_size, scale=scale, estimator=estimator, std_eps=std_eps)
  constant_P = grpo.constant_groups(total_B, group_size, std_eps=std_eps)
  keep_B = jnp.ones_like(total_B)
  if drop_constant:
    keep_B = jnp.repeat(1.0 - constant_P.astype(jnp.float32), group_size)
  return advantages_B, keep_B, jnp.mean(constant_P.astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("forced_end",))
def logprob_metrics(sampler_logp, old_logp, *, forced_end: bool) -> dict:
  """Rollout-level scalars of the learner's old log-probs [B, N] (from the first update).

  forced_end: the last generated token is the end token by rule (log-prob 0 under both); it is no
  sample of the policy and stays out of the entropy estimate.
  """
  sampled_BxN = old_logp[:, :-1] if forced_end else old_logp
  return {
      # The sampler's log-probs vs the learner's recomputation of the same policy: their kernels differ
      # (KV-cache decode vs teacher forcing), equal up to float rounding in float32 but not in bfloat16;
      # `grpo.tis_cap` corrects for the difference.
      "logprob/sampler_vs_recomputed_max_abs": jnp.max(jnp.abs(sampler_logp - old_logp)),
      # Monte-Carlo estimate of the sampling distribution's per-token entropy, E[-log p].
      "policy/entropy": -jnp.mean(sampled_BxN),
  }


def token_mask(layout, loss_tokens: str) -> jnp.ndarray:
  """[N] 1.0 for the generated tokens the loss covers: all of them, or only the target grid's."""
  n = layout.num_new_tokens
  if loss_tokens == "all":
    return jnp.ones((n,), jnp.float32)
  target = layout.grid_slice(layout.target)
  return jnp.zeros((n,), jnp.float32).at[target].set(1.0)


def host_metadata(batch_metadata: dict, group_size: int) -> dict:
  """All of the batch's metadata repeated to one row per sample (arrays and lists)."""
  return {k: (np.repeat(v, group_size, axis=0) if isinstance(v, np.ndarray) else
              [x for x in v for _ in range(group_size)]) for k, v in batch_metadata.items()}


@dataclasses.dataclass(frozen=True)
class RolloutResult:
  """One collected batch: what the updates read (`batch`, `decoder_batch`) and what the step logs.

  Rows: prompts x token grids x decoder samples (`setup.rollout_groups`), prompt-major; the AR batch has
  one row per token grid, the decoder batch one per image."""
  batch: step_lib.Rollout | None  # the AR update's inputs (None when it does not train); old/ref log-probs NaN
  prompt_len: int                 # the prompt part of each sequence (static: one compiled update)
  layout: Any                     # the generated grids' layout (`sample.layout`)
  images: jax.Array               # [B, H, W, 3] uint8
  total: jax.Array                # [B] total reward of each image (the AR policy's rewards, else the decoder's)
  prompts: list[str]              # B prompts, one per image
  metrics: dict                   # rollout-level scalars (reward/..., advantage/...), on device
  timings: dict                   # {"rollout", "reward"} seconds
  decoder_batch: decoder_step.DecoderRollout | None = None  # the decoder update's inputs
  window: decoder_step.Window | None = None                 # its trained steps

  @property
  def update_shape(self) -> tuple:
    """What the compiled update depends on besides the batch size."""
    return self.prompt_len, self.layout


def decoder_noise(run, key, num_prompts: int):
  """(initial latents [B, C, h, w], SDE noise keys [B]) of a decoder-policy rollout.

  Shared within a prompt's token grids when `sampling.share_noise_in_group` (the AR groups then differ
  only by their tokens, as in an "ar" run), distinct across a grid's decoder samples always (the decoder
  groups differ only by the decoder's noise)."""
  ga, gd = run.ar_group, run.decoder_group
  share = run.config.sampling.share_noise_in_group
  row_B = np.arange(num_prompts * ga * gd)
  source_B = (row_B // (ga * gd)) * gd + row_B % gd if share else row_B
  draws = num_prompts * (gd if share else ga * gd)
  latent_key, sde_key = jax.random.split(key)
  cfg = run.pipeline.configs
  f = cfg.vae.scale_factor
  shape = (cfg.dit.in_channels, run.pipeline.spec.height // f, run.pipeline.spec.width // f)
  latents = run.pipeline.shard_batch(jax.random.normal(latent_key, (draws, *shape))[source_B])
  return latents, jax.random.split(sde_key, draws)[source_B]


def window_start(config, key):
  """The SDE window's first step: config.decoder.window_start, or -1: uniform over the steps it fits."""
  d = config.decoder
  if d.window_start >= 0:
    return jnp.asarray(d.window_start, jnp.int32)
  return jax.random.randint(key, (), 0, d.train_steps - d.window_size + 1, jnp.int32)


def _reward_metrics(prefix: str, total, components, advantages, zero_var) -> dict:
  out = {
      f"{prefix}reward/zero_variance_group_frac": zero_var,
      f"{prefix}advantage/mean": jnp.mean(advantages),
      f"{prefix}advantage/std": jnp.std(advantages),
      f"{prefix}reward/mean": jnp.mean(total),
      f"{prefix}reward/std": jnp.std(total),
  }
  for name, s in components.items():
    out[f"{prefix}reward/{name}/mean"] = jnp.mean(s)
    out[f"{prefix}reward/{name}/std"] = jnp.std(s)
  return out


def ar_prefix(run) -> str:
  """The AR policy's metrics prefix: none in an AR-only run (its names as ever), "ar/" beside the decoder."""
  return "" if run.policies == ("ar",) else "ar/"


def collect(run, data_batch, key, trainable, dit_trainable=None) -> RolloutResult:
  """Samples, decodes and scores one batch.

  The learner's old_logp (and ref_logp when the KL term is on) are computed by the first update,
  which returns them; until then they are NaN, so anything reading them earlier poisons the loss
  (and the update skips itself) instead of passing silently. `dit_trainable`: the decoder policy's
  trained DiT state (with "decoder" in config.train.policies).
  """
  cfg = run.config
  ga, gd = run.ar_group, run.decoder_group
  num_prompts = len(data_batch.prompts)
  t0 = time.perf_counter()
  source = data_batch.source_images if cfg.data.mode == "i2i" else None
  prepared = run.pipeline.prepare(data_batch.prompts, source, ar_params=(trainable, run.frozen))
  token_key, noise_key = jax.random.split(key)
  sample = run.pipeline.sample_tokens(prepared, jax.random.split(token_key, num_prompts * ga), ga,
                                      ar_params=(trainable, run.frozen))
  decoder_batch = window = None
  if run.decoder is None:
    latents = run.pipeline.initial_latents(noise_key, num_prompts, ga)
    images, _ = run.pipeline.decode_tokens(prepared, sample.target, latents, ga, run.pipeline.source_cache(prepared))
  else:
    noise_key, window_key = jax.random.split(noise_key)
    target_B = run.pipeline.shard_batch(jnp.repeat(sample.target, gd, axis=0))
    latents, noise_keys_B = decoder_noise(run, noise_key, num_prompts)
    start = window_start(cfg, window_key)
    dit_params = run.decoder.dit_params(dit_trainable)
    # The sampler's conditioning is the update's: the glyph encoder runs once.
    cond, target_size, crop = run.pipeline.conditioning(prepared, target_B, ga * gd)
    images, _, trajectory = run.pipeline.decode_tokens(
        prepared, target_B, latents, ga * gd, dit_params=dit_params, steps=cfg.decoder.train_steps,
        sde=decode.SdeWindow(noise_level=float(cfg.decoder.noise_level), size=cfg.decoder.window_size),
        window_start=start, noise_keys_B=noise_keys_B, conditioning=(cond, target_size, crop))
    window = decoder_step.Window.at(*run.pipeline.schedule(cfg.decoder.train_steps), start, cfg.decoder.window_size)
    batch_first = lambda x_WxB: run.pipeline.shard_batch(jnp.swapaxes(x_WxB, 0, 1))
    decoder_batch = decoder_step.DecoderRollout(
        cond=jax.tree.map(run.pipeline.shard_batch, cond), target_size=run.pipeline.shard_batch(target_size),
        crop=run.pipeline.shard_batch(crop), latents_before=batch_first(trajectory.latents_before),
        latents_after=batch_first(trajectory.latents_after), sampler_logp=batch_first(trajectory.sampler_logp),
        old_logp=None, advantages=None, mask=None)
  jax.block_until_ready(images)
  t1 = time.perf_counter()

  prompts = [p for p in data_batch.prompts for _ in range(ga * gd)]
  metadata = host_metadata(data_batch.metadata, ga * gd)
  extra, rollout, total = {}, None, None
  if "ar" in run.policies:
    total, components = run.composer.score(images, prompts, metadata)
    # A token grid's reward is the mean over its decoder samples (one sample in an AR-only run).
    ar_total = jnp.mean(total.reshape(num_prompts * ga, gd), axis=1)
    advantages, keep_B, zero_var = advantage_stats(
        ar_total, group_size=ga, scale=cfg.grpo.scale, estimator=cfg.grpo.estimator, std_eps=run.composer.std_eps,
        drop_constant=cfg.grpo.drop_zero_variance_groups)
    mask = keep_B[:, None] * token_mask(sample.layout, cfg.grpo.loss_tokens)[None, :]
    not_yet = jnp.full_like(sample.logprobs, jnp.nan)  # the first update's output (same shape: one program)
    rollout = step_lib.Rollout(
        sequence_ids=sample.sequence_ids, positions=sample.positions, valid=sample.valid,
        sampler_logp=sample.logprobs, old_logp=not_yet, advantages=advantages, mask=mask,
        ref_logp=not_yet if cfg.grpo.beta > 0 else None)
    extra.update(_reward_metrics(ar_prefix(run), total, components, advantages, zero_var))
  if decoder_batch is not None:
    d_total, d_components = run.decoder_composer.score(images, prompts, metadata)
    d_advantages, d_keep_B, d_zero_var = advantage_stats(
        d_total, group_size=gd, scale=cfg.grpo.scale, estimator=cfg.grpo.estimator,
        std_eps=run.decoder_composer.std_eps, drop_constant=cfg.grpo.drop_zero_variance_groups)
    steps = cfg.decoder.window_size
    decoder_batch = decoder_batch.replace(
        old_logp=jnp.full_like(decoder_batch.sampler_logp, jnp.nan), advantages=d_advantages,
        mask=jnp.broadcast_to(d_keep_B[:, None], (d_keep_B.shape[0], steps)))
    extra.update(_reward_metrics("decoder/", d_total, d_components, d_advantages, d_zero_var))
    extra["decoder/window_start"] = start.astype(jnp.float32)
    total = d_total if total is None else total
  jax.block_until_ready(total)
  t2 = time.perf_counter()
  return RolloutResult(batch=rollout, prompt_len=sample.prompt_len, layout=sample.layout, images=images,
                       total=total, prompts=prompts, metrics=extra, timings={"rollout": t1 - t0, "reward": t2 - t1},
                       decoder_batch=decoder_batch, window=window)

