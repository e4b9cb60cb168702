"""One GRPO rollout: sample groups of images, score them, and turn the scores into advantages.

Everything stays on device between the sampler, the decoder, pure-JAX rewards and the advantages;
only host-side rewards (e.g. JPEG size) fetch the images. The learner's old log-probs are not
computed here: the first update computes them (`glmrl.train.step`).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from glmrl import grpo
from glmrl.train import step as step_lib


@functools.partial(jax.jit, static_argnames=("composer", "group_size", "scale", "estimator", "drop_constant"))
def score(host_components, images, metadata, *, composer, group_size, scale, estimator, drop_constant):
  """Rewards -> (total [B], components, advantages [B], row mask [B], zero-variance group fraction).

  "Zero variance" is `grpo.constant_groups` with the run's threshold (`composer.std_eps`, from
  config.grpo.std_eps, as the per-reward normalisation uses): the groups whose advantages are
  exactly 0, and the ones `drop_constant` removes from the loss.
  """
  components = dict(composer.jax_scores(images, metadata))
  components.update(host_components)
  total = composer.combine(components)
  std_eps = composer.std_eps
  advantages = grpo.group_advantages(total, group_size, scale=scale, estimator=estimator, std_eps=std_eps)
  constant_G = grpo.constant_groups(total, group_size, std_eps=std_eps)
  keep_B = jnp.ones_like(total)
  if drop_constant:
    keep_B = jnp.repeat(1.0 - constant_G.astype(jnp.float32), group_size)
  return total, components, advantages, keep_B, jnp.mean(constant_G.astype(jnp.float32))


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


def reward_metadata(host_meta: dict) -> dict:
  """The numeric arrays of the per-sample metadata, on device for the jitted rewards."""
  return {k: jnp.asarray(v) for k, v in host_meta.items()
          if isinstance(v, np.ndarray) and (np.issubdtype(v.dtype, np.number) or v.dtype == np.bool_)}


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


def collect(run, data_batch, key, trainable):
  """Samples, decodes and scores one batch.

  Returns (Rollout, (prompt_len, layout), images, total reward, timings, metrics, prompts). The
  learner's old_logp (and ref_logp when the KL term is on) are computed by the first update, which
  returns them; until then they are NaN, so anything reading them earlier poisons the loss (and the
  update skips itself) instead of passing silently.
  """
  cfg, g = run.config, run.group_size
  t0 = time.perf_counter()
  source = data_batch.source_images if cfg.data.mode == "i2i" else None
  prepared = run.pipeline.prepare(data_batch.prompts, source, ar_params=(trainable, run.frozen))
  token_key, noise_key = jax.random.split(key)
  b = len(data_batch.prompts) * g
  sample = run.pipeline.sample_tokens(prepared, jax.random.split(token_key, b), g,
                                      ar_params=(trainable, run.frozen))
  latents = run.pipeline.initial_latents(noise_key, len(data_batch.prompts), g)
  images, _ = run.pipeline.decode_tokens(prepared, sample.target, latents, g, run.pipeline.source_cache(prepared))
  jax.block_until_ready(images)
  t1 = time.perf_counter()

  prompts = [p for p in data_batch.prompts for _ in range(g)]
  host_meta = host_metadata(data_batch.metadata, g)
  metadata = reward_metadata(host_meta)
  # Host-side inputs of model-backed rewards (e.g. cached CLIP text embeddings of the prompts).
  metadata.update(run.composer.prepare(prompts, host_meta))
  host_components = {}
  if any(not e["reward"].pure_jax for e in run.composer.entries):
    host_components = {k: jnp.asarray(v) for k, v in
                       run.composer.host_scores(np.asarray(images), prompts, host_meta).items()}
  total, components, advantages, keep_B, zero_var = score(
      host_components, images, metadata, composer=run.composer, group_size=g,
      scale=cfg.grpo.scale, estimator=cfg.grpo.estimator, drop_constant=cfg.grpo.drop_zero_variance_groups)
  jax.block_until_ready(total)
  t2 = time.perf_counter()

  mask = keep_B[:, None] * token_mask(sample.layout, cfg.grpo.loss_tokens)[None, :]
  not_yet = jnp.full_like(sample.logprobs, jnp.nan)  # the first update's output (same shape: one program)
  rollout = step_lib.Rollout(
      sequence_ids=sample.sequence_ids, positions=sample.positions, valid=sample.valid,
      sampler_logp=sample.logprobs, old_logp=not_yet, advantages=advantages, mask=mask,
      ref_logp=not_yet if cfg.grpo.beta > 0 else None)
  extra = {
      "reward/zero_variance_group_frac": zero_var,
      "advantage/mean": jnp.mean(advantages),
      "advantage/std": jnp.std(advantages),
      "reward/mean": jnp.mean(total),
      "reward/std": jnp.std(total),
  }
  for name, s in components.items():
    extra[f"reward/{name}/mean"] = jnp.mean(s)
    extra[f"reward/{name}/std"] = jnp.std(s)
  timings = {"rollout": t1 - t0, "reward": t2 - t1}
  return rollout, (sample.prompt_len, sample.layout), images, total, timings, extra, prompts
