"""Jit-compiled autoregressive sampling of GLM-Image's image tokens.

One compiled program per (batch, prompt length, generation layout, sampling config):
a prefill `step` over the prompt into a preallocated KV cache, then a `lax.scan` of
single-token `step`s. The number of new tokens is fixed by the layout (text-to-image:
preview grid + target grid + end token; image-to-image: target grid + end token), so
nothing depends on what was sampled. Each sample draws from its own PRNG key
(`keys_B[b]` folded with the token index), so a sample does not depend on the rest of
the batch and a run is reproducible from its seed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from glmrl.models.ar import positions as positions_lib
from glmrl.models.ar.model import merge_image_tokens
from glmrl.models.ar.prompt import GenerationLayout, TokenizedPrompts
from glmrl.sampling.logprobs import SamplingConfig, TokenRule, filter_mask, head_logits, masked_logprobs

@struct.dataclass
class SampleOutput:
  """Generated tokens and what `logprobs.teacher_forced_logprobs` needs to recompute their log-probs."""
  tokens: jax.Array  # [B, N] int32, all generated tokens (grids in generation order, then the end token)
  logprobs: jax.Array  # [B, N] float32, under the distribution each token was drawn from
  target: jax.Array  # [B, H, W] int32, the target grid
  preview: jax.Array | None  # [B, h, w] int32 (text-to-image), None for image-to-image
  sequence_ids: jax.Array  # [B, L + N] int32, prompt (condition-image ids filled in) + generated tokens
  positions: jax.Array  # [3, B, L + N] int32
  valid: jax.Array  # [B, L + N] bool, False on left padding
  prompt_len: int = struct.field(pytree_node=False)
  layout: GenerationLayout = struct.field(pytree_node=False)


def _choose(logits_BxV, step, keys_B, cfg: SamplingConfig, rule: TokenRule):
  """Next tokens [B] and their log-probs [B] at generated-token index `step`."""
  keep_BxV = filter_mask(logits_BxV, step, cfg, rule)
  if cfg.greedy:
    tokens_B = first_argmax(jnp.where(keep_BxV, logits_BxV, -jnp.inf))
  else:
    scaled_BxV = jnp.where(keep_BxV, logits_BxV / jnp.float32(cfg.temperature), -jnp.inf)
    tokens_B = categorical(jax.vmap(lambda k: jax.random.fold_in(k, step))(keys_B), scaled_BxV)
  return tokens_B, masked_logprobs(logits_BxV, tokens_B, keep_BxV, cfg.temperature)


def categorical(keys_B: jax.Array, logits_BxV: jax.Array) -> jax.Array:
  """int32 [B]: row b drawn with keys_B[b], the very draw of `jax.random.categorical(keys_B[b], logits_BxV[b])`
  (its Gumbel noise added to the logits), with `first_argmax` for its argmax."""
  noise_BxV = jax.vmap(lambda k: jax.random.gumbel(k, logits_BxV.shape[1:], logits_BxV.dtype))(keys_B)
  return first_argmax(noise_BxV + logits_BxV)


def first_argmax(x_BxV: jax.Array) -> jax.Array:
  """int32 [B]: `jnp.argmax(x, -1)` (the first maximum; the first NaN if any) as two plain reductions.

  XLA:CPU runs argmax's (value, index) pair reduction element by element: 3.6 ms per token for 8 x 16,512
  logits with their Gumbel noise, against 0.9 ms for a max then a min over the indices that reach it.
  """
  top_Bx1 = jnp.max(x_BxV, axis=-1, keepdims=True)
  ids_V = jnp.arange(x_BxV.shape[-1], dtype=jnp.int32)
  hit_BxV = (x_BxV == top_Bx1) | jnp.isnan(x_BxV)
  return jnp.min(jnp.where(hit_BxV, ids_V, jnp.int32(x_BxV.shape[-1])), axis=-1)


@functools.partial(jax.jit, static_argnames=("graphdef", "layout", "cfg"))
def _sample_ids(graphdef, state, input_ids_BxL, valid_BxL, positions_3xBxL, decode_Bx3xN, keys_B, *,
                layout: GenerationLayout, cfg: SamplingConfig):
  model = nnx.merge(graphdef, state)
  rule = TokenRule.for_model(model, layout, cfg.constrain_to_codebook)
  b, l = input_ids_BxL.shape
  n = layout.num_new_tokens
  # The last generated token is never fed back, so the cache needs L + N - 1 slots.
  cache = model.init_cache(b, l + n - 1)
  key_valid_BxT = jnp.concatenate([valid_BxL, jnp.ones((b, n - 1), bool)], axis=1)
  h_BxLxD, cache = model.step(input_ids_BxL, positions_3xBxL, key_valid_BxT, cache, 0)
  first_B, first_lp_B = _choose(head_logits(model, h_BxLxD[:, -1:])[:, 0], 0, keys_B, cfg, rule)
  # The decode loop reads its weights from behind a barrier with the prefill's results, so whatever XLA derives
  # from them for the loop (a TPU relayout copy of every MLP kernel, 9 GB for the released generator on one chip)
  # is made after the prefill, not kept alive across its peak. (Only what the loop reads: a barrier keeps its
  # operands, and the vision encoder's weights would become arguments.)
  text, head, cache, first_B = jax.lax.optimization_barrier(
      (nnx.state(model.text), nnx.state(model.lm_head), cache, first_B))
  nnx.update(model.text, text)
  nnx.update(model.lm_head, head)

  def decode(carry, xs):
    cache, prev_B = carry
    step, pos_3xB = xs
    # Token `step - 1` sits at cache slot L + step - 1 with generated-token position `step - 1`.
    h_Bx1xD, cache = model.step(prev_B[:, None], pos_3xB[:, :, None], key_valid_BxT, cache, l + step - 1)
    tok_B, lp_B = _choose(head_logits(model, h_Bx1xD)[:, 0], step, keys_B, cfg, rule)
    return (cache, tok_B), (tok_B, lp_B)

  steps = jnp.arange(1, n, dtype=jnp.int32)
  fed_pos_Nx3xB = jnp.transpose(decode_Bx3xN[:, :, :n - 1], (2, 1, 0))
  _, (rest_NxB, rest_lp_NxB) = jax.lax.scan(decode, (cache, first_B), (steps, fed_pos_Nx3xB))
  tokens_BxN = jnp.concatenate([first_B[:, None], rest_NxB.T], axis=1)
  logprobs_BxN = jnp.concatenate([first_lp_B[:, None], rest_lp_NxB.T], axis=1)
  return tokens_BxN, logprobs_BxN


def _check_keys(keys_B, batch: int):
  keys_B = jnp.asarray(keys_B) if not isinstance(keys_B, jax.Array) else keys_B
  typed = jnp.issubdtype(keys_B.dtype, jax.dtypes.prng_key)
  shape_ok = keys_B.ndim == 1 if typed else (keys_B.ndim == 2 and keys_B.dtype == jnp.uint32)
  if not shape_ok or keys_B.shape[0] != batch:
    raise ValueError(f"keys_B must hold one PRNG key per sample ({batch}), e.g. "
                     f"jax.random.split(jax.random.key(seed), {batch}); got {keys_B.dtype} {keys_B.shape}")
  return keys_B


def sample_ids(model, input_ids_BxL, valid_BxL, positions_3xBxL, decode_Bx3xN, keys_B, *,
               layout: GenerationLayout, cfg: SamplingConfig = SamplingConfig()) -> SampleOutput:
  """Samples the layout's tokens after prompts whose ids and positions are ready.

  input_ids_BxL must already hold condition-image codebook ids (no placeholders);
  positions come from `positions.rope_index`.
  """
  b, l = np.shape(input_ids_BxL)
  n = layout.num_new_tokens
  if np.shape(valid_BxL) != (b, l) or np.shape(positions_3xBxL) != (3, b, l):
    raise ValueError(f"valid {np.shape(valid_BxL)} / positions {np.shape(positions_3xBxL)} do not match "
                     f"input_ids [{b}, {l}]")
  if np.shape(decode_Bx3xN) != (b, 3, n):
    raise ValueError(f"decode positions {np.shape(decode_Bx3xN)} must be [{b}, 3, {n}] for layout {layout}")
  keys_B = _check_keys(keys_B, b)
  graphdef, state = nnx.split(model)
  input_ids_BxL = jnp.asarray(input_ids_BxL, jnp.int32)
  valid_BxL = jnp.asarray(valid_BxL, bool)
  positions_3xBxL = jnp.asarray(positions_3xBxL, jnp.int32)
  decode_Bx3xN = jnp.asarray(decode_Bx3xN, jnp.int32)
  tokens_BxN, logprobs_BxN = _sample_ids(graphdef, state, input_ids_BxL, valid_BxL, positions_3xBxL, decode_Bx3xN,
                                       keys_B, layout=layout, cfg=cfg)
  return _sample_output(tokens_BxN, logprobs_BxN, input_ids_BxL, valid_BxL, positions_3xBxL, decode_Bx3xN,
                        layout=layout)


@functools.partial(jax.jit, static_argnames=("layout",))
def _sample_output(tokens_BxN, logprobs_BxN, input_ids_BxL, valid_BxL, positions_3xBxL, decode_Bx3xN, *,
                   layout: GenerationLayout) -> SampleOutput:
  """The sampled tokens with their grids and the whole sequences, in one program (op by op, each slice and
  concatenation was one)."""
  b, l = input_ids_BxL.shape
  (th, tw), target_slice = layout.target_hw, layout.grid_slice(layout.target)
  preview = None
  if layout.preview_hw is not None:
    ph, pw = layout.preview_hw
    preview = tokens_BxN[:, layout.grid_slice(0)].reshape(b, ph, pw)
  return SampleOutput(
      tokens=tokens_BxN, logprobs=logprobs_BxN, target=tokens_BxN[:, target_slice].reshape(b, th, tw),
      preview=preview, sequence_ids=jnp.concatenate([input_ids_BxL, tokens_BxN], axis=1),
      positions=jnp.concatenate([positions_3xBxL, jnp.transpose(decode_Bx3xN, (1, 0, 2))], axis=2),
      valid=jnp.concatenate([valid_BxL, jnp.ones((b, layout.num_new_tokens), bool)], axis=1), prompt_len=l,
      layout=layout)


def sample(model, batch: TokenizedPrompts, keys_B, cfg: SamplingConfig = SamplingConfig()) -> SampleOutput:
  """Samples image tokens for a prompt batch (text-to-image, or image-to-image with its condition images)."""
  mcfg = model.cfg
  input_ids = np.asarray(batch.input_ids)
  _check_keys(keys_B, input_ids.shape[0])
  if batch.pixel_values is not None:
    image_ids = np.asarray(model.image_tokens(batch.pixel_values, batch.source_grid_thw))
    input_ids = merge_image_tokens(input_ids, image_ids, mcfg.image_token_id)
  elif (input_ids[batch.valid] == mcfg.image_token_id).any():
    raise ValueError("the prompts hold image placeholder tokens but the batch has no pixel_values")
  positions_3xBxL, decode_Bx3xN = positions_lib.rope_index(
      input_ids, batch.valid, batch.image_grid_thw, batch.images_per_sample,
      image_start_id=mcfg.image_start_token_id, image_end_id=mcfg.image_end_token_id)
  return sample_ids(model, input_ids, batch.valid, positions_3xBxL, decode_Bx3xN, keys_B, layout=batch.layout,
                  cfg=cfg)
