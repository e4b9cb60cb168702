"""An exponential moving average of a policy's trained parameters: DiffusionNFT's old policy (it samples the
rollouts and is the v_old of the loss), AWM's anchor, DGPO's ema_ref, and a smoother model to evaluate or export.

ema <- decay_n ema + (1 - decay_n) params, where n is the optimizer's own step count when the average updates
(optax's `count`: the updates taken, so the index holds whatever num_iterations, a resume or a skipped update
did), decay_n = 0 for n < `flat`, then min(decay, ramp * (n - flat)) when `ramp` > 0, else `decay`. It updates
`after` every `every`-th rollout (its updates done: DiffusionNFT's loop at each epoch's end, its `global_step` the
gradient steps so far, NVlabs/DiffusionNFT scripts/train_nft_sd3.py lines 1021 and 1035; AWM's likewise) or every
`every`-th optimizer step (DGPO's ema_ref, after each step, read before its step is counted: `flat` 1). This is
DiffusionNFT's `return_decay` (train_nft_sd3.py lines 169-189: decay_type 1 is flat 0, ramp 0.001, decay 0.5;
type 2 flat 75, ramp 0.0075, decay 0.999). The average is kept in float32 whatever the parameters' dtype (a
bfloat16 average would round the small (1 - decay) steps away) and placed like the parameters; its decay is a
float32 computed in the update's program from the count, so no step waits for the host.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp


AFTER = ("rollout", "update")  # when it updates (config.decoder.ema.after)


@dataclasses.dataclass(frozen=True)
class EmaSettings:
  """config.decoder.ema: `every` 0 keeps no average."""
  decay: float = 0.0
  every: int = 0
  ramp: float = 0.0
  flat: int = 0
  after: str = "rollout"

  @property
  def enabled(self) -> bool:
    return self.every > 0

  def decay_at(self, count) -> jax.Array:
    """The float32 decay of an update once the optimizer has taken `count` steps (an int or a traced one)."""
    n = jnp.asarray(count, jnp.float32)
    decay = jnp.float32(self.decay)
    if self.ramp > 0:
      decay = jnp.minimum(decay, jnp.float32(self.ramp) * (n - self.flat))
    return jnp.where(n < self.flat, jnp.float32(0.0), decay)

  def due(self, after: str, rollout_step: int) -> bool:
    """Whether it may update at moment `after` ("rollout": once rollout step `rollout_step`, 1-based, has updated;
    "update": after an optimizer step, every `every`-th of them by the count, `update`)."""
    return self.enabled and self.after == after and (after == "update" or rollout_step % self.every == 0)


def init(params):
  """The average's start: a float32 copy of `params`, placed like them."""
  return jax.tree.map(lambda p: jnp.copy(p.astype(jnp.float32)), params)


@functools.partial(jax.jit, static_argnums=3, donate_argnums=0)
def update(ema, params, count, settings: EmaSettings):
  """ema <- decay ema + (1 - decay) params (float32) at the decay of the optimizer's step count `count`, the old
  average's buffers donated; updating after every optimizer step, one whose count is not a multiple of `every`
  keeps the average (decay 1)."""
  decay = settings.decay_at(count)
  if settings.after == "update":
    decay = jnp.where(count % settings.every == 0, decay, jnp.float32(1.0))
  return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p.astype(jnp.float32), ema, params)


def as_params(ema, like):
  """The average in the dtypes of `like` (the trained parameters), for the model to run with."""
  return jax.tree.map(lambda e, p: e.astype(p.dtype), ema, like)
