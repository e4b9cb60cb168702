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
  """One collected batch: what the update reads (`batch`) and what the step logs."""
  batch: step_lib.Rollout      # the update's inputs; old/ref log-probs NaN until the first update
  prompt_len: int              # the prompt part of each sequence (static: one compiled update)
  layout: Any                  # the generated grids' layout (`sample.layout`)
  images: jax.Array            # [B, H, W, 3] uint8
  total: jax.Array             # [B] total reward
  prompts: list[str]           # B prompts, one per sample
  metrics: dict                # rollout-level scalars (reward/..., advantage/...), on device
  timings: dict                # {"rollout", "reward"} seconds

  @property
  def update_shape(self) -> tuple:
    """What the compiled update depends on besides the batch size."""
    return self.prompt_len, self.layout


def collect(run, data_batch, key, trainable) -> RolloutResult:
  """Samples, decodes and scores one batch.

  The learner's old_logp (and ref_logp when the KL term is on) are computed by the first update,
  which returns them; until then they are NaN, so anything reading them earlier poisons the loss
  (and the update skips itself) instead of passing silently.
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
  total, components = run.composer.score(images, prompts, host_metadata(data_batch.metadata, g))
  advantages, keep_B, zero_var = advantage_stats(
      total, group_size=g, scale=cfg.grpo.scale, estimator=cfg.grpo.estimator, std_eps=run.composer.std_eps,
      drop_constant=cfg.grpo.drop_zero_variance_groups)
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
  return RolloutResult(batch=rollout, prompt_len=sample.prompt_len, layout=sample.layout, images=images,
                       total=total, prompts=prompts, metrics=extra, timings={"rollout": t1 - t0, "reward": t2 - t1})
