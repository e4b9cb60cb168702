"""An exponential moving average of a policy's trained parameters: DiffusionNFT's old policy (it samples the
rollouts and is the v_old of the loss), AWM's anchor, and a smoother model to evaluate or export.

After every `every`-th rollout step s (counting from 1), ema <- decay_n ema + (1 - decay_n) params, where
n = s * `steps_per_rollout` is the schedule's step and decay_n = 0 for n < `flat`, then
min(decay, ramp * (n - flat)) when `ramp` > 0, else `decay`. This is DiffusionNFT's `return_decay`
(NVlabs/DiffusionNFT scripts/train_nft_sd3.py lines 169-189: its decay_type 1 is flat 0, ramp 0.001, decay 0.5;
type 2 flat 75, ramp 0.0075, decay 0.999: the old policy follows the trained one exactly, then ever more slowly),
which its loop evaluates once per epoch (one rollout) at its `global_step`, the gradient steps taken so far (lines
1021 and 1035): `steps_per_rollout` is its gradient steps per epoch, 2 in its OCR recipe
(`config/nft.py` `sd3_ocr`, gradient_step_per_epoch=2), 1 in the others. The average is kept in float32 whatever
the parameters' dtype (a bfloat16 average would round the small (1 - decay) steps away) and placed like the
parameters.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class EmaSettings:
  """config.decoder.ema: `every` 0 keeps no average."""
  decay: float = 0.0
  every: int = 0
  ramp: float = 0.0
  flat: int = 0
  steps_per_rollout: int = 1

  @property
  def enabled(self) -> bool:
    return self.every > 0

  def decay_at(self, step: int) -> float:
    """The decay of the update after rollout step `step` (1-based), at schedule step `step * steps_per_rollout`."""
    n = step * self.steps_per_rollout
    if n < self.flat:
      return 0.0
    return min(self.decay, self.ramp * (n - self.flat)) if self.ramp > 0 else self.decay

  def due(self, step: int) -> bool:
    return self.enabled and step % self.every == 0


def init(params):
  """The average's start: a float32 copy of `params`, placed like them."""
  return jax.tree.map(lambda p: jnp.copy(p.astype(jnp.float32)), params)


@functools.partial(jax.jit, donate_argnums=0)
def update(ema, params, decay):
  """ema <- decay ema + (1 - decay) params (float32), the old average's buffers donated."""
  decay = jnp.asarray(decay, jnp.float32)
  return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p.astype(jnp.float32), ema, params)


def as_params(ema, like):
  """The average in the dtypes of `like` (the trained parameters), for the model to run with."""
  return jax.tree.map(lambda e, p: e.astype(p.dtype), ema, like)
