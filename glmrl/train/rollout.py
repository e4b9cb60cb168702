"""One GRPO rollout: sample groups of images, score them, and turn the scores into advantages.

Everything stays on device between the sampler, the decoder, pure-JAX rewards and the advantages;
only host-side rewards (e.g. JPEG size) fetch the images, a decoder call's images at a time while the next call
runs (`reward_stream`; `config.rollout.overlap_rewards`). Scoring is `RewardComposer.score_inputs`, the path
evaluation takes too (`score`). Each trained policy turns the scores into its own batch
(`glmrl.policy`). The learner's old log-probs are not computed here: the first update computes them.
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
from glmrl.policy import registry
from glmrl.train import reward_stream


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


def host_metadata(batch_metadata: dict, group_size: int) -> dict:
  """All of the batch's metadata repeated to one row per sample (arrays and lists)."""
  return {k: (np.repeat(v, group_size, axis=0) if isinstance(v, np.ndarray) else
              [x for x in v for _ in range(group_size)]) for k, v in batch_metadata.items()}


@dataclasses.dataclass(frozen=True)
class Sampled:
  """What one rollout sampled, before any policy's scoring (`Policy.rollout_batch` reads it)."""
  sample: Any                     # ar_sampler.SampleOutput: [B_grids, ...] tokens, log-probs, sequences
  images: jax.Array               # [B, H, W, 3] uint8
  legs: dict = dataclasses.field(default_factory=dict)  # policy name -> its rollout leg's part (a DiT policy's)


@dataclasses.dataclass(frozen=True)
class RolloutResult:
  """One collected batch: what each policy's updates read (`batches`, by policy name) and what the step logs.

  Rows: prompts x token grids x decoder samples (`Run.request`), prompt-major; the AR batch has one row per
  token grid, the decoder batch one per image."""
  batches: dict                   # policy name -> its update's inputs; learner log-probs NaN
  update_shapes: dict             # policy name -> what its compiled update depends on (static)
  images: jax.Array               # [B, H, W, 3] uint8
  total: jax.Array                # [B] total reward of each image (the first policy's rewards)
  prompts: list[str]              # B prompts, one per image
  metrics: dict                   # rollout-level scalars (reward/..., advantage/...), on device
  # {"rollout", "sampling", "decode", "reward", "reward_wait"} seconds (rollout = sampling + decode; reward: from the
  # decode's end until the rewards and advantages are on device; reward_wait: of it, the wait for the host rewards)
  # and "rewards": {each host reward (its policy's prefix): seconds its function ran}.
  timings: dict
  tokens: int                     # generated tokens of the rollout


@jax.jit
def _reward_stats(total, components, advantages, zero_var) -> dict:
  """The rollout's reward and advantage scalars, one program (op by op, each mean and spread was its own)."""
  out = {
      "reward/zero_variance_group_frac": zero_var,
      "advantage/mean": jnp.mean(advantages),
      "advantage/std": jnp.std(advantages),
      "reward/mean": jnp.mean(total),
      "reward/std": jnp.std(total),
  }
  for name, s in components.items():
    out[f"reward/{name}/mean"] = jnp.mean(s)
    out[f"reward/{name}/std"] = jnp.std(s)
  return out


def collect(run, data_batch, key, trainables: dict, step: int = 0) -> RolloutResult:
  """Samples, decodes and scores one batch for every trained policy (`trainables`: policy name -> its
  current trained state) at rollout step `step` (where a sliding SDE window is).

  The learner's old_logp (and ref_logp when the KL term is on) are computed by the first update,
  which returns them; until then they are NaN, so anything reading them earlier poisons the loss
  (and the update skips itself) instead of passing silently.
  """
  cfg, request = run.config, run.request
  ga = request.grids_per_prompt
  num_prompts = len(data_batch.prompts)
  params = run.sampling_params(trainables)
  t0 = time.perf_counter()
  source = data_batch.source_images if cfg.data.mode == "i2i" else None
  prepared = run.pipeline.prepare(data_batch.prompts, source, ar_params=params["ar_params"])
  token_key, noise_key = jax.random.split(key)
  sample = run.pipeline.sample_tokens(prepared, jax.random.split(token_key, num_prompts * ga), ga,
                                      ar_params=params["ar_params"])
  # The decode reads the tokens, so it cannot start before they are done: waiting for them here splits the
  # rollout's time into its two parts at the cost of one dispatch, not of any overlap.
  jax.block_until_ready(sample.tokens)
  t_sampled = time.perf_counter()
  prompts = [p for p in data_batch.prompts for _ in range(request.images_per_prompt)]
  metadata = host_metadata(data_batch.metadata, request.images_per_prompt)
  inputs = {name: composer.inputs(prompts, metadata) for name, composer in run.composers.items()}
  stream = reward_stream.RewardStream(run.composers, prompts, inputs, len(prompts)) \
      if cfg.rollout.overlap_rewards else None
  on_images = None if stream is None else stream.add
  try:
    legs, extra = {}, {}
    leg_policy = registry.decoding(run.policies)
    if leg_policy is not None:  # the DiT policy decodes as its update needs
      images, legs[leg_policy.name], leg_metrics = leg_policy.rollout_leg(
          run, prepared, sample, noise_key, params["dit_params"], step, on_images=on_images)
      extra.update({leg_policy.prefix(tuple(run.policies)) + k: v for k, v in leg_metrics.items()})
    else:
      latents = run.pipeline.initial_latents(noise_key, num_prompts, ga)
      images, _ = run.pipeline.decode_tokens(prepared, sample.target, latents, ga,
                                             run.pipeline.source_cache(prepared), dit_params=params["dit_params"],
                                             on_images=on_images)
    jax.block_until_ready(images)
    t1 = time.perf_counter()
    host = {} if stream is None else stream.result(images)
  finally:
    if stream is not None:
      stream.close()
  waited = 0.0 if stream is None else stream.waited
  seconds = {} if stream is None else stream.seconds()

  sampled = Sampled(sample, images, legs)
  batches, shapes, first_total = {}, {}, None
  for name, policy in run.policies.items():
    composer = run.composers[name]
    composer.check_batch(images, prompts)
    own = seconds.setdefault(name, {})
    if stream is None and composer.has_host_rewards:  # the serial path scores its host rewards after the decode
      t_host = time.perf_counter()
      host[name] = composer.host_components(images, prompts, inputs[name], own)
      waited += time.perf_counter() - t_host
    total, components = composer.score_inputs(images, prompts, inputs[name], host.get(name, {}))
    rewards, group = policy.group_rewards(total, request)
    advantages, keep_B, zero_var = advantage_stats(
        rewards, group_size=group, scale=policy.settings.advantage_scale, estimator=cfg.grpo.estimator,
        std_eps=composer.std_eps, drop_constant=cfg.grpo.drop_zero_variance_groups)
    batches[name] = policy.rollout_batch(sampled, advantages, keep_B)
    shapes[name] = policy.update_shape(sampled)
    prefix = policy.prefix(tuple(run.policies))
    extra.update({prefix + k: v for k, v in _reward_stats(total, components, advantages, zero_var).items()})
    first_total = total if first_total is None else first_total
  jax.block_until_ready(first_total)
  t2 = time.perf_counter()
  reward_seconds = {run.policies[name].prefix(tuple(run.policies)) + reward: v
                    for name, own in seconds.items() for reward, v in own.items()}
  return RolloutResult(batches=batches, update_shapes=shapes, images=images, total=first_total, prompts=prompts,
                       metrics=extra, timings={"rollout": t1 - t0, "sampling": t_sampled - t0,
                                               "decode": t1 - t_sampled, "reward": t2 - t1, "reward_wait": waited,
                                               "rewards": reward_seconds},
                       tokens=int(sample.logprobs.shape[0] * sample.logprobs.shape[1]))
