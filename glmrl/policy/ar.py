"""The AR generator's policy: GRPO on its image tokens. Its rollout batch and that batch's abstract shapes, its
spec, its update (one jitted function, micro-batched with exact loss accumulation), its FLOPs and the bound policy
(`ArPolicy`).

There is no separate old-log-prob pass. The first update of a rollout (`first=True`) takes
old = stop_gradient(new) inside its own micro-batch loss: its ratio is exp(0) = 1 exactly, for
every dtype, mesh and micro-batch size, and a forward of the model per step is saved. It returns
those log-probs (and, with the KL term, the reference policy's, computed by the same function on the
same micro-batches), and later iterations (`first=False`) read them: old and new log-probs come
from the same program on the same shapes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from flax import struct

from glmrl import grpo
from glmrl.checkpoint.manager import AR_CONFIG_FILE
from glmrl.models import lora as lora_lib
from glmrl.models.ar.prompt import GenerationLayout
from glmrl.policy import accumulate
from glmrl.policy.base import BoundPolicy, FlopCounts, Request, Saved, Settings, lora_settings
from glmrl.sampling.logprobs import SamplingConfig, sampling_config, teacher_forced_logprobs

# The AR model's parts that full fine-tuning trains; the vision encoder and VQ stay frozen.
TRAINABLE = nnx.All(nnx.Param, nnx.Not(nnx.Any(nnx.PathContains("visual"), nnx.PathContains("vq"))))


@struct.dataclass
class Rollout:
  """What the update needs of one rollout batch (all [B, ...], sharded over the batch axes)."""
  sequence_ids: jax.Array  # [B, S] prompt + generated tokens
  positions: jax.Array     # [3, B, S]
  valid: jax.Array         # [B, S] False on left padding
  sampler_logp: jax.Array  # [B, N] the sampler's own log-probs of the generated tokens
  old_logp: jax.Array      # [B, N] the learner's, before the first update (which computes them; NaN until then)
  advantages: jax.Array    # [B]
  mask: jax.Array          # [B, N] 1 for tokens in the loss, 0 for dropped groups
  ref_logp: jax.Array | None = None  # [B, N] under the frozen initial policy (beta > 0; as old_logp)


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
  """Static description of the update (hashable: part of the compiled program's identity)."""
  prompt_len: int
  layout: GenerationLayout
  sampling: SamplingConfig
  micro_batches: int
  epsilon_low: float
  epsilon_high: float
  beta: float
  kl: str
  aggregation: str
  logprob_chunk: int = 256
  remat: bool = False
  tis_cap: float = 0.0
  tis_mode: str = "token_truncate"
  dual_clip: float = 0.0
  ratio_level: str = "token"
  kl_bias_correction: bool = False
  # The KL term's reference policy: "params" (the `ref_params` passed in, a copy of the initial
  # policy) or "adapters_off" (LoRA: these params with every adapter's B zeroed, i.e. the base).
  reference: str = "params"


def rollout_logprobs(graphdef, params, frozen, rollout: Rollout, spec: UpdateSpec) -> jax.Array:
  """Log-probs [B, N] of the rollout's generated tokens under `params` (the one log-prob function)."""
  # Fresh Variables (copy=True copies no arrays): remat'd layers write back to their Variables, which
  # jax.grad refuses for ones made outside its trace, such as frozen base weights under LoRA.
  model = nnx.merge(graphdef, params, frozen, copy=True)
  return teacher_forced_logprobs(model, rollout.sequence_ids, rollout.positions, rollout.valid,
                                 prompt_len=spec.prompt_len, layout=spec.layout, cfg=spec.sampling,
                                 chunk_size=spec.logprob_chunk, remat=spec.remat)


def _micro_loss(params, graphdef, frozen, mb: Rollout, first, spec: UpdateSpec):
  logp = rollout_logprobs(graphdef, params, frozen, mb, spec)
  # The policy that sampled is `params` itself on the first iteration: its log-probs are these very
  # values (no second evaluation that could round differently), held constant.
  old_logp = jnp.where(first, jax.lax.stop_gradient(logp), mb.old_logp)
  max_tokens = logp.shape[1] if spec.aggregation == "seq_mean_token_sum_norm" else None
  _, aux = grpo.policy_loss(
      logp, old_logp, mb.advantages, mb.mask, epsilon_low=spec.epsilon_low, epsilon_high=spec.epsilon_high,
      ref_logp=mb.ref_logp, beta=spec.beta, kl=spec.kl, aggregation=spec.aggregation, max_tokens=max_tokens,
      sampler_logp=mb.sampler_logp, tis_cap=spec.tis_cap, tis_mode=spec.tis_mode, dual_clip=spec.dual_clip,
      ratio_level=spec.ratio_level, kl_bias_correction=spec.kl_bias_correction)
  return aux["numerator"], (aux, old_logp)


# Token-weighted means of the micro-batches (summed as mean x tokens, divided by all tokens at the end).
_MEAN_STATS = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean", "tis_weight_mean", "tis_capped_frac")



def accumulate_gradients(graphdef, params, frozen, rollout: Rollout, ref_params, first, *, spec: UpdateSpec):
  """Summed float32 gradient of the loss numerators over the micro-batches, and the loss statistics.

  Returns (grads_sum, stats, old_logp [B, N], ref_logp [B, N] or None). Whatever the parameter dtype,
  the sum runs in float32: micro-batch gradients of bfloat16 params added in bfloat16 lose the
  smaller micro-batches' contributions to rounding. With `first`, old_logp are the log-probs this
  forward computed (and ref_logp those of `ref_params`, by the same function on the same
  micro-batch); otherwise the rollout's, passed through.
  """
  grad_fn = jax.grad(_micro_loss, has_aux=True)
  micro = accumulate.split_micro(rollout, spec.micro_batches)
  if spec.reference == "adapters_off" and rollout.ref_logp is not None:
    ref_params = lora_lib.adapters_off(params)
  use_ref = ref_params is not None and rollout.ref_logp is not None
  mean_stats = _MEAN_STATS + (("clip_frac_dual",) if spec.dual_clip else ())

  def body(carry, mb):
    ref_logp = None
    if use_ref:
      ref_logp = jax.lax.cond(
          first, lambda: jax.lax.stop_gradient(rollout_logprobs(graphdef, ref_params, frozen, mb, spec)),
          lambda: mb.ref_logp)
      mb = mb.replace(ref_logp=ref_logp)
    grads, (aux, old_logp) = grad_fn(params, graphdef, frozen, mb, first, spec)
    tokens = jnp.sum(mb.mask > 0).astype(jnp.float32)
    return accumulate.add(carry, grads, aux, tokens, mean_stats), (old_logp, ref_logp)

  (grads_sum, stats), (old_MxBxN, ref_MxBxN) = jax.lax.scan(body, accumulate.init(params, mean_stats), micro)
  return grads_sum, stats, accumulate.merge_micro(old_MxBxN), accumulate.merge_micro(ref_MxBxN)


def update(graphdef, params, frozen, opt_state, rollout: Rollout, ref_params=None, first=True, *,
           spec: UpdateSpec, tx: optax.GradientTransformation, schedule):
  """One optimizer step on the rollout; returns (params, opt_state, metrics, (old_logp, ref_logp)).

  `first`: this is the rollout's first update (old log-probs = this forward's; see the module
  docstring). The gradient of loss = sum(numerator) / sum(denominator) is accumulated over
  micro-batches as sum(grad numerator) / sum(denominator), which equals the full-batch gradient
  exactly (the denominators do not depend on the parameters). A non-finite loss or gradient leaves
  params and optimizer state untouched and reports `skipped = 1`.
  """
  grads_sum, stats, old_logp, ref_logp = accumulate_gradients(graphdef, params, frozen, rollout, ref_params,
                                                              first, spec=spec)
  per_token = jnp.maximum(jnp.sum(rollout.mask > 0), 1).astype(jnp.float32)
  new_params, new_opt_state, metrics = accumulate.apply(tx, schedule, params, opt_state, grads_sum, stats, per_token)
  if spec.tis_cap:
    metrics["tis/weight_mean"] = stats["tis_weight_mean"] / per_token
    metrics["tis/capped_frac"] = stats["tis_capped_frac"] / per_token
  return new_params, new_opt_state, metrics, (old_logp, ref_logp)


@functools.partial(jax.jit, static_argnames=("layout", "loss_tokens"))
def loss_mask(keep_B, *, layout, loss_tokens: str) -> jnp.ndarray:
  """[B, N] the kept rows' generated tokens the loss covers: all of them, or only the target grid's."""
  n = layout.num_new_tokens
  if loss_tokens == "all":
    per_token_N = jnp.ones((n,), jnp.float32)
  else:
    per_token_N = jnp.zeros((n,), jnp.float32).at[layout.grid_slice(layout.target)].set(1.0)
  return keep_B[:, None] * per_token_N[None, :]


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


# The AR generator's trained state: the step's `params` and `opt_state` items (it keeps no moving average); its LoRA
# record lora.json; its HF config (the export writes the trained generator with it).
SAVED = Saved(params="params", opt_state="opt_state", ema=None, adapters_file="lora.json",
              model_config_file=AR_CONFIG_FILE, lora_section="config.lora", role="generator",
              export_component="vision_language_encoder")


class ArPolicy(BoundPolicy):
  """GRPO on the AR generator's tokens, bound to the run's config: groups of token grids per prompt."""
  name = "ar"
  component = "ar"
  saved = SAVED
  salt = 0x10FA
  full_filter = TRAINABLE
  micro_batch_key = "config.train.micro_batch_size"
  programs = ("rewards", "update")
  rewards_key = "rewards"

  def __init__(self, config):
    super().__init__(config)
    self.settings = Settings(lora=lora_settings(config.lora), optim=config.optim,
                             num_iterations=config.grpo.num_iterations, beta=float(config.grpo.beta),
                             micro_batch_size=config.train.micro_batch_size, advantage_scale=config.grpo.scale)
    self.request = Request(grids_per_prompt=config.grpo.group_size)

  def spec(self, prompt_len: int, layout, batch: int) -> UpdateSpec:
    """The static description of its update for its prompt length, generation layout and `batch` rows."""
    config, settings = self.config, self.settings
    return UpdateSpec(
        prompt_len=prompt_len, layout=layout, sampling=sampling_config(config.sampling),
        micro_batches=settings.micro_batches(batch), epsilon_low=float(config.grpo.epsilon_low),
        epsilon_high=float(config.grpo.epsilon_high), beta=settings.beta, kl=config.grpo.kl,
        aggregation=config.grpo.aggregation, remat=config.model.remat, tis_cap=float(config.grpo.tis_cap),
        reference=settings.reference, tis_mode=config.grpo.tis_mode, dual_clip=float(config.grpo.dual_clip),
        ratio_level=config.grpo.ratio_level, kl_bias_correction=bool(config.grpo.kl_bias_correction))

  def rows_per_prompt(self, request: Request) -> int:
    """Rows of its update per prompt: one per token grid."""
    return request.grids_per_prompt

  def rewards(self, request: Request) -> tuple:
    """(its reward entries, the rows a per-group normalisation spans: a prompt's images)."""
    return self.config[self.rewards_key], request.images_per_prompt

  def prefix(self, policies) -> str:
    """None in an AR-only run (its metric names as ever), "ar/" beside another policy."""
    return "" if tuple(policies) == ("ar",) else "ar/"

  def group_rewards(self, total_B, request: Request):
    # A token grid's reward is the mean over its decoder samples (one sample when the decoder is not trained).
    return jnp.mean(total_B.reshape(-1, request.samples_per_grid), axis=1), request.grids_per_prompt

  def rollout_batch(self, sampled, advantages, keep) -> Rollout:
    sample = sampled.sample
    mask = loss_mask(keep, layout=sample.layout, loss_tokens=self.config.grpo.loss_tokens)
    not_yet = jnp.full_like(sample.logprobs, jnp.nan)  # the first update's output (same shape: one program)
    return Rollout(sequence_ids=sample.sequence_ids, positions=sample.positions, valid=sample.valid,
                   sampler_logp=sample.logprobs, old_logp=not_yet, advantages=advantages, mask=mask,
                   ref_logp=not_yet if self.settings.beta > 0 else None)

  def abstract_inputs(self, run) -> tuple:
    """(update shape, Rollout) of its update, abstract: one row per token grid of the rollout."""
    b, l, n = run.batch_size, run.prompt_len, run.layout.num_new_tokens
    per_token = lambda: run.batch_array((b, n), jnp.float32)
    batch = Rollout(
        sequence_ids=run.batch_array((b, l + n), jnp.int32),
        positions=run.batch_array((3, b, l + n), jnp.int32, batch_axis=1),
        valid=run.batch_array((b, l + n), jnp.bool_), sampler_logp=per_token(), old_logp=per_token(),
        advantages=run.batch_array((b,), jnp.float32), mask=per_token(),
        ref_logp=per_token() if self.settings.beta > 0 else None)
    return (l, run.layout, b), batch

  def update_shape(self, sampled) -> tuple:
    """(prompt length, generation layout, rows: one per token grid)."""
    return sampled.sample.prompt_len, sampled.sample.layout, sampled.sample.logprobs.shape[0]

  def make_update(self, state, shape):
    return state.jit_update(update, self.spec(*shape))

  def after_first(self, batch: Rollout, outputs) -> tuple[Rollout, dict]:
    old_logp, ref_logp = outputs
    return batch.replace(old_logp=old_logp, ref_logp=ref_logp), logprob_metrics(
        batch.sampler_logp, old_logp, forced_end=bool(self.config.sampling.constrain_to_codebook))

  def update_flops(self, counts: FlopCounts) -> float:
    """Per iteration the teacher-forced forward, a backward of 2x it for the activations and, for full
    fine-tuning, 2x more for the weight gradients; remat repeats the forward."""
    settings = self.settings
    return float(settings.num_iterations * counts.ar_forward * ((2 if self.config.model.remat else 1) +
                                                                (2 if settings.lora.enabled else 4)))
