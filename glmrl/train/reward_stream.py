"""Host-side and served rewards scored while the decoder runs: each decoder call's images are handed over as soon as
that call is dispatched (`decode_tokens`'s `on_images`), and a worker thread per reward composer scores them once the
device has them, while the device decodes the next call. Pure-JAX rewards stay in the scoring program after the
decode. Only the scoring of a part moves under the decoding of the next: the batch, its rewards and its advantages
are the serial path's (`RewardComposer.score_inputs` with these host scores), so training stays on-policy.

A composer's parts are scored in order, one at a time (a host reward is never called from two threads at once, as
in the serial path); a part that fails ends its composer's scoring (later parts are not sent) and `result` raises
its error, the serial path's error for the same images.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def rows_of(metadata: Mapping[str, Any], first: int, stop: int, batch: int) -> dict:
  """The per-sample values of rows [first, stop) (values of another length are passed whole)."""
  part = {}
  for k, v in metadata.items():
    per_row = isinstance(v, (np.ndarray, jax.Array, list, tuple)) and getattr(v, "ndim", 1) > 0 and len(v) == batch
    part[k] = v[first:stop] if per_row else v
  return part


@functools.lru_cache(maxsize=None)
def _joined(layout):
  """The parts' scores as one array of the batch's rows in `layout` (None: the default device), one program per
  layout and shapes, compiled once."""
  return jax.jit(lambda *parts: jnp.concatenate(parts), out_shardings=layout)


class _Scoring:
  """One composer's host rewards over the batch's parts, in order on one worker thread."""

  def __init__(self, composer, prompts: Sequence[str], metadata: Mapping[str, Any], batch: int):
    self.composer, self.prompts, self.metadata, self.batch = composer, list(prompts), metadata, batch
    self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reward-stream")
    self.parts: list[tuple[int, concurrent.futures.Future]] = []
    self.seconds: dict[str, float] = {}
    self.failed = False

  def add(self, first: int, images) -> None:
    self.parts.append((first, self.pool.submit(self._score, first, images)))

  def _score(self, first: int, images) -> dict | None:
    if self.failed:  # an earlier part failed: the step fails with its error, nothing more is sent
      return None
    stop = first + images.shape[0]
    try:
      return self.composer.host_components(images, self.prompts[first:stop],
                                           rows_of(self.metadata, first, stop, self.batch), self.seconds, first)
    except BaseException:
      self.failed = True
      raise

  def result(self, layout) -> dict:
    """{reward name: float32 [B]} laid out as the serial path lays them out (`layout`: `host_layout`'s)."""
    done = []
    for first, future in sorted(self.parts, key=lambda p: p[0]):
      done.append(future.result())  # the first failed part raises its error
    if sum(next(iter(d.values())).shape[0] for d in done) != self.batch:
      raise RuntimeError(f"the decoder handed {len(done)} parts that do not cover the batch of {self.batch} images")
    return {n: _joined(layout)(*[d[n] for d in done]) for n in done[0]}

  def close(self) -> None:
    self.failed = True  # parts still queued (the decode failed) are not scored
    self.pool.shutdown(wait=True, cancel_futures=True)


class RewardStream:
  """The host rewards of every composer that has any, scored a decoder call at a time.

  `add(first, images)` is the decoder's `on_images`; `result(images)` waits for every part and returns
  {composer name: its host scores}, where `images` is the whole decoded batch; `close()` always."""

  def __init__(self, composers: Mapping[str, Any], prompts: Sequence[str], inputs: Mapping[str, Mapping], batch: int):
    self.scorings = {name: _Scoring(c, prompts, inputs[name], batch) for name, c in composers.items()
                     if c.has_host_rewards}
    self.waited = 0.0

  def add(self, first: int, images) -> None:
    for scoring in self.scorings.values():
      scoring.add(first, images)

  def result(self, images) -> dict:
    t0 = time.perf_counter()
    try:
      return {name: s.result(s.composer.host_layout(images)) for name, s in self.scorings.items()}
    finally:
      self.waited = time.perf_counter() - t0

  def seconds(self) -> dict:
    """{composer name: {host reward: seconds its function ran, over every part}}."""
    return {name: dict(s.seconds) for name, s in self.scorings.items()}

  def close(self) -> None:
    for scoring in self.scorings.values():
      scoring.close()
