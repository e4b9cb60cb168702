"""Per-token log-probs of generated image tokens under the sampling distribution.

The sampling distribution of generated token j is (in this order, as transformers'
`generate` with a logits processor):
  1. the codebook rule (`constrain_to_codebook`): inside a grid only codebook ids
     (< codebook size), at the last position only the end token;
  2. temperature: logits / T;
  3. top-k: keep logits >= the k-th largest (ties kept);
  4. top-p: keep the smallest set of largest-probability tokens whose mass exceeds p
     (the token crossing p is kept);
  softmax over what is kept.
`filter_mask` derives the kept set; the sampler and `teacher_forced_logprobs` both use it, so a
recomputation on the sampler's logits reproduces its log-probs.

`teacher_forced_logprobs` is the teacher-forced recomputation used for both the "old" and the
"new" log-probs of GRPO: differentiable w.r.t. the model parameters, lm_head + log-softmax
in chunks over the generated tokens (never [B, L, V] float32 logits at once), each chunk
rematerialised in the backward pass when `remat`.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

from glmrl import grpo
from glmrl.models.ar.prompt import GenerationLayout


def _is_real(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How image tokens are drawn (hashable: a static jit argument).

  Defaults are the released generation config (temperature 0.9, top-p 0.75, no top-k).
  `top_k=0` and `top_p=1.0` switch those filters off. `greedy` takes the most likely
  token instead of sampling; log-probs are still those of the distribution above.
  """
  temperature: float = 0.9
  top_p: float = 0.75
  top_k: int = 0
  greedy: bool = False
  constrain_to_codebook: bool = True

  def __post_init__(self):
    if not _is_real(self.temperature) or not self.temperature > 0:
      raise ValueError(f"temperature={self.temperature!r} must be > 0")
    if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p!r} must be in (0, 1]")
    if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k={self.top_k!r} must be an int >= 0 (0 = off)")


def sampling_config(s) -> SamplingConfig:
  """A run's `config.sampling` section `s` as the sampler and the learner read it."""
  return SamplingConfig(temperature=float(s.temperature), top_p=float(s.top_p), top_k=int(s.top_k),
                        constrain_to_codebook=bool(s.constrain_to_codebook))


@dataclasses.dataclass(frozen=True)
class TokenRule:
  """Which ids generated token j may take: codebook ids inside the grids, the end id last."""
  num_new_tokens: int
  codebook_size: int
  end_id: int
  enabled: bool = True

  @classmethod
  def for_model(cls, model, layout: GenerationLayout, enabled: bool) -> "TokenRule":
    cfg = model.cfg
    return cls(num_new_tokens=layout.num_new_tokens, codebook_size=cfg.vq.num_embeddings,
               end_id=cfg.text.eos_token_id, enabled=enabled)

  def allowed(self, step_N: jax.Array, vocab: int) -> jax.Array:
    """[..., V] bool for generated-token indices step_N [...]."""
    ids_V = jnp.arange(vocab, dtype=jnp.int32)
    is_last = (jnp.asarray(step_N) == self.num_new_tokens - 1)[..., None]
    return jnp.where(is_last, ids_V == self.end_id, ids_V < self.codebook_size)

  def mask(self, step_N: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """`allowed` broadcast to logits of `shape` (all true when the rule is off)."""
    if not self.enabled:
      return jnp.ones(shape, bool)
    return jnp.broadcast_to(self.allowed(step_N, shape[-1]), shape)


def _order_keys(x: jax.Array) -> jax.Array:
  """uint32 keys ordered as the float32 values `x` (-inf lowest; no NaN): IEEE bits with the sign folded."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def top_p_threshold(scaled_NxV: jax.Array, top_p: float) -> jax.Array:
  """[..., 1] order key of the least value nucleus (top-p) sampling keeps, without sorting the vocabulary.

  Ascending by value, the tokens whose cumulative mass is at most 1 - p go: the threshold is the largest
  value x with mass(values < x) <= 1 - p (the token crossing p, and all its ties, stay; at least the
  largest value stays). mass(values < key) is monotone in the key, so 32 bisection steps over the uint32
  order keys find it exactly, each one masked sum over the vocabulary: O(32 V) against a sort's O(V log V)
  with a far worse constant (one 16,512-entry sort per sample and token).
  """
  probs_NxV = jax.nn.softmax(scaled_NxV, axis=-1)
  keys_NxV = _order_keys(scaled_NxV)
  lo = jnp.min(keys_NxV, axis=-1, keepdims=True)  # mass below the least value is 0: always satisfies
  hi = jnp.max(keys_NxV, axis=-1, keepdims=True)
  removable = jnp.float32(1.0 - top_p)

  def halve(_, bounds):
    lo, hi = bounds
    gap = hi - lo
    mid = lo + (gap >> 1) + (gap & 1)  # upper middle: lo < mid <= hi while lo < hi (no uint32 overflow)
    below = jnp.sum(jnp.where(keys_NxV < mid, probs_NxV, 0.0), axis=-1, keepdims=True)
    ok = below <= removable
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

  lo, _ = jax.lax.fori_loop(0, 32, halve, (lo, hi))
  return lo


def filter_mask(logits_NxV: jax.Array, step_N: jax.Array, cfg: SamplingConfig, rule: TokenRule) -> jax.Array:
  """Kept set [..., V] of the sampling distribution (see the module docstring)."""
  logits_NxV = jax.lax.stop_gradient(logits_NxV.astype(jnp.float32))
  vocab = logits_NxV.shape[-1]
  keep = rule.mask(step_N, logits_NxV.shape)
  scaled = jnp.where(keep, logits_NxV / jnp.float32(cfg.temperature), -jnp.inf)
  # One materialised `scaled` for the k-th value (and the top-p threshold) and the comparisons with it: without
  # the barrier XLA:GPU gave the k-th value and the values compared with it different rounding, and the k-th
  # token fell below its own value (7 of 8 kept at 87 of 508 tokens on an H200, docs/benchmarks.md).
  scaled = jax.lax.optimization_barrier(scaled)
  if cfg.top_k and cfg.top_k < vocab:
    kth = jax.lax.top_k(scaled, cfg.top_k)[0][..., -1:]
    keep &= scaled >= kth
    scaled = jnp.where(keep, scaled, -jnp.inf)
  if cfg.top_p < 1.0:
    keep &= _order_keys(scaled) >= top_p_threshold(scaled, cfg.top_p)
  return keep


def masked_logprobs(logits_NxV: jax.Array, tokens_N: jax.Array, keep_NxV: jax.Array,
                    temperature: float) -> jax.Array:
  """log softmax(logits / T) over the kept set, at `tokens_N` (-inf outside the kept set)."""
  masked = jnp.where(keep_NxV, logits_NxV.astype(jnp.float32), -jnp.inf)
  return grpo.token_logprobs(masked, tokens_N, temperature)


def head_logits(model, h_BxNxD: jax.Array) -> jax.Array:
  """Float32 vision-vocabulary logits of final-normed hidden states."""
  return model.lm_head(h_BxNxD).astype(jnp.float32)


def teacher_forced_logprobs(model, sequence_ids_BxS: jax.Array, positions_3xBxS: jax.Array,
                            valid_BxS: jax.Array, *, prompt_len: int, layout: GenerationLayout,
                            cfg: SamplingConfig, chunk_size: int = 256, remat: bool = True) -> jax.Array:
  """Log-probs [B, N] of the generated tokens sequence_ids[:, prompt_len:] (N = layout.num_new_tokens).

  Teacher forcing with the sampler's positions; the same rule, temperature and top-k/top-p
  as the sampler. A generated token is always kept in its own top-k/top-p set: the
  teacher-forced logits differ from the sampler's cached ones by rounding, and a token
  sampled right at the top-p boundary must not get log-prob -inf from that alone (it
  does get -inf if it breaks the codebook rule). `chunk_size` generated tokens share one
  lm_head + log-softmax; `remat` recomputes each chunk's logits in the backward pass.
  """
  b, s = sequence_ids_BxS.shape
  n = layout.num_new_tokens
  if s != prompt_len + n or prompt_len < 1:
    raise ValueError(f"sequence length {s} must be prompt_len ({prompt_len}) + {n} generated tokens")
  if tuple(positions_3xBxS.shape) != (3, b, s) or tuple(valid_BxS.shape) != (b, s):
    raise ValueError(f"positions {tuple(positions_3xBxS.shape)} / valid {tuple(valid_BxS.shape)} must be "
                     f"[3, {b}, {s}] / [{b}, {s}]")
  if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
    raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
  rule = TokenRule.for_model(model, layout, cfg.constrain_to_codebook)
  # The last generated token predicts nothing: feed the sequence without it.
  h_BxSxD = model.hidden_states(sequence_ids_BxS[:, :-1], positions_3xBxS[:, :, :-1], valid_BxS[:, :-1])
  h_BxNxD = h_BxSxD[:, prompt_len - 1:]
  tokens_BxN = sequence_ids_BxS[:, prompt_len:].astype(jnp.int32)

  chunk = min(chunk_size, n)
  num_chunks = -(-n // chunk)
  pad = num_chunks * chunk - n
  h_UxBxZxD = jnp.pad(h_BxNxD, ((0, 0), (0, pad), (0, 0))).reshape(b, num_chunks, chunk, -1).swapaxes(0, 1)
  tokens_UxBxZ = jnp.pad(tokens_BxN, ((0, 0), (0, pad))).reshape(b, num_chunks, chunk).swapaxes(0, 1)
  step_UxZ = jnp.arange(num_chunks * chunk, dtype=jnp.int32).reshape(num_chunks, chunk)

  def one_chunk(args):
    h_BxZxD, tokens_BxZ, step_Z = args
    logits_BxZxV = head_logits(model, h_BxZxD)
    keep = filter_mask(logits_BxZxV, step_Z[None], cfg, rule)
    keep |= jax.nn.one_hot(tokens_BxZ, logits_BxZxV.shape[-1], dtype=bool) & rule.mask(step_Z[None], keep.shape)
    return masked_logprobs(logits_BxZxV, tokens_BxZ, keep, cfg.temperature)

  body = jax.checkpoint(one_chunk) if remat else one_chunk
  logprobs_UxBxZ = jax.lax.map(body, (h_UxBxZxD, tokens_UxBxZ, step_UxZ))
  return logprobs_UxBxZ.swapaxes(0, 1).reshape(b, num_chunks * chunk)[:, :n]


def sample_logprobs(model, sample, cfg: SamplingConfig, *, chunk_size: int = 256, remat: bool = True) -> jax.Array:
  """`teacher_forced_logprobs` of an `ar_sampler.SampleOutput` (its sequence, positions and validity)."""
  return teacher_forced_logprobs(model, sample.sequence_ids, sample.positions, sample.valid,
                                 prompt_len=sample.prompt_len, layout=sample.layout, cfg=cfg,
                                 chunk_size=chunk_size, remat=remat)


