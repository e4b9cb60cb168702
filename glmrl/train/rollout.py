"""One GRPO rollout: sample groups of images, score them, and turn the scores into advantages.

Everything stays on device between the sampler, the decoder, pure-JAX rewards, the advantages
and the old log-probs; only host-side rewards (e.g. JPEG size) fetch the images.
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
  """Rewards -> (total [B], components, advantages [B], row mask [B], zero-variance group fraction)."""
  components = dict(composer.jax_scores(images, metadata))
  components.update(host_components)
  total = composer.combine(components)
  advantages = grpo.group_advantages(total, group_size, scale=scale, estimator=estimator)
  r_GxN = total.reshape(-1, group_size)
  constant_G = jnp.max(r_GxN, axis=1) == jnp.min(r_GxN, axis=1)
  keep_B = jnp.ones_like(total)
  if drop_constant:
    keep_B = jnp.repeat(1.0 - constant_G.astype(jnp.float32), group_size)
  return total, components, advantages, keep_B, jnp.mean(constant_G.astype(jnp.float32))


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


def collect(run, data_batch, key, trainable, ref_params, fns_for):
  """Samples, decodes and scores one batch.

  `fns_for(prompt_len, layout)` gives the run's jitted (log-prob, update) functions for the
  sample's static shape. Returns (Rollout, fns, images, total reward, timings, metrics, prompts).
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
      host_components, images, metadata, composer=run.composer, group_size=g, scale=cfg.grpo.scale,
      estimator=cfg.grpo.estimator, drop_constant=cfg.grpo.drop_zero_variance_groups)
  jax.block_until_ready(total)
  t2 = time.perf_counter()

  mask = keep_B[:, None] * token_mask(sample.layout, cfg.grpo.loss_tokens)[None, :]
  partial = step_lib.Rollout(sample.sequence_ids, sample.positions, sample.valid, sample.logprobs, advantages,
                             mask)
  # Old (and reference) log-probs from the same function the update differentiates.
  fns = fns_for(sample.prompt_len, sample.layout)
  logprob_fn = fns[0]
  old_logp = logprob_fn(trainable, run.frozen, partial)
  ref_logp = logprob_fn(ref_params, run.frozen, partial) if ref_params is not None else None
  rollout = partial.replace(old_logp=old_logp, ref_logp=ref_logp)
  extra = {
      "reward/zero_variance_group_frac": zero_var,
      # The sampler's own log-probs vs the recomputation: equal on-policy up to float rounding.
      "logprob/sampler_vs_recomputed_max_abs": jnp.max(jnp.abs(sample.logprobs - old_logp)),
      # Monte-Carlo estimate of the sampling distribution's per-token entropy, E[-log p].
      "policy/entropy": -jnp.mean(old_logp),
      "advantage/mean": jnp.mean(advantages),
      "advantage/std": jnp.std(advantages),
      "reward/mean": jnp.mean(total),
      "reward/std": jnp.std(total),
  }
  for name, s in components.items():
    extra[f"reward/{name}/mean"] = jnp.mean(s)
    extra[f"reward/{name}/std"] = jnp.std(s)
  timings = {"rollout": t1 - t0, "reward": t2 - t1}
  return rollout, fns, images, total, timings, extra, prompts
