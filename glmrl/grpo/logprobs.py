"""Per-token log-probabilities under a temperature-scaled softmax."""

import jax
import jax.numpy as jnp

from glmrl.grpo._checks import is_static


def token_logprobs(logits, tokens, temperature=1.0):
  """log softmax(logits / temperature)[tokens], in float32.

  logits: [..., V]; tokens: integer [...] with the leading shape of logits.
  """
  logits = jnp.asarray(logits)
  tokens = jnp.asarray(tokens)
  if tuple(logits.shape[:-1]) != tuple(tokens.shape):
    raise ValueError(
        f"logits shape {tuple(logits.shape)} does not match tokens shape {tuple(tokens.shape)}: "
        "expected logits [..., vocab] with tokens [...]")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"tokens must be integers, got dtype {tokens.dtype}")
  if is_static(temperature) and not temperature > 0:
    raise ValueError(f"temperature={temperature} must be > 0")
  scaled = logits.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
  # Shift by the max before gathering: large logits would otherwise cancel
  # catastrophically in float32. The shift has no gradient (it cancels exactly).
  shifted = scaled - jax.lax.stop_gradient(jnp.max(scaled, axis=-1, keepdims=True))
  picked = jnp.take_along_axis(shifted, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
