"""Deterministic, resumable iterator over batches of prompt records.

The record stream is the concatenation of per-epoch permutations, epoch `e`
shuffled by `np.random.default_rng((seed, e))`. Batches are consecutive chunks
of `prompts_per_step` records of that stream, so a batch may straddle two
epochs and every batch has the same size. The position (epoch, index into that
epoch's permutation) is the whole state: a run restored from `state()` yields
exactly the batches an uninterrupted run would.
"""

import dataclasses
from typing import Any, Sequence

import numpy as np

from glmrl.data.prompts import PromptRecord, check_image_size, load_image


@dataclasses.dataclass(frozen=True)
class PromptBatch:
  """One step's prompts.

  `metadata` is what the rewards receive: `target_image` uint8 [B, H, W, 3]
  when the records have targets, and every key of the records' `metadata`
  objects, as a numeric numpy array when all B values stack into one and
  otherwise a list of B values (None where a record lacks the key).
  `source_images[b]` is uint8 [N_b, H, W, 3] (N_b may be 0).
  """
  prompts: list[str]
  metadata: dict[str, Any]
  source_images: list[np.ndarray]
  indices: np.ndarray  # int64 [B], positions of the records in the loaded list


class PromptIterator:
  """Infinite iterator of `PromptBatch`es with a small JSON-able position."""

  def __init__(self, records: Sequence[PromptRecord], *, prompts_per_step: int, seed: int,
               height: int, width: int):
    if not records:
      raise ValueError("records is empty")
    if isinstance(prompts_per_step, bool) or not isinstance(prompts_per_step, (int, np.integer)) \
        or prompts_per_step <= 0:
      raise ValueError(f"prompts_per_step={prompts_per_step!r} must be a positive integer")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"seed={seed!r} must be a non-negative integer")
    check_image_size(height, width)
    self._records = list(records)
    self._batch = int(prompts_per_step)
    self._seed = int(seed)
    self._height = int(height)
    self._width = int(width)
    self._epoch = 0
    self._index = 0
    self._order_cache: tuple[int, np.ndarray] | None = None

  @property
  def num_records(self) -> int:
    return len(self._records)

  def epoch_order(self, epoch: int) -> np.ndarray:
    """The permutation of record indices used in `epoch`."""
    if self._order_cache is None or self._order_cache[0] != epoch:
      rng = np.random.default_rng((self._seed, epoch))
      self._order_cache = (epoch, rng.permutation(len(self._records)))
    return self._order_cache[1]

  def state(self) -> dict[str, int]:
    return {"epoch": self._epoch, "index": self._index, "seed": self._seed,
            "num_records": len(self._records)}

  def restore(self, state: dict[str, Any]) -> None:
    """Moves to a position from `state()`; the seed and record count must match."""
    self.check_state(state)
    self._epoch = int(state["epoch"])
    self._index = int(state["index"])

  def check_state(self, state: dict[str, Any]) -> None:
    """ValueError unless `state` (from `state()`) is a position of this iterator: the same seed and records."""
    if not isinstance(state, dict) or set(state) != {"epoch", "index", "seed", "num_records"}:
      raise ValueError(f"iterator state {state!r} must have exactly the keys epoch, index, seed, num_records")
    for key, value in state.items():
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"iterator state {key}={value!r} must be a non-negative integer")
    if state["seed"] != self._seed:
      raise ValueError(f"iterator state seed={state['seed']} differs from this iterator's seed={self._seed}")
    if state["num_records"] != len(self._records):
      raise ValueError(f"iterator state num_records={state['num_records']} differs from the "
                       f"{len(self._records)} records loaded")
    if state["index"] >= len(self._records):
      raise ValueError(f"iterator state index={state['index']} must be < num_records={len(self._records)}")

  def __iter__(self):
    return self

  def __next__(self) -> PromptBatch:
    picked = []
    while len(picked) < self._batch:
      order = self.epoch_order(self._epoch)
      take = min(self._batch - len(picked), len(order) - self._index)
      picked.extend(order[self._index:self._index + take].tolist())
      self._index += take
      if self._index == len(order):
        self._epoch += 1
        self._index = 0
    return self.make_batch(picked)

  def make_batch(self, indices: list[int]) -> PromptBatch:
    """The batch of the records at `indices` (images loaded and resized)."""
    recs = [self._records[i] for i in indices]
    metadata: dict[str, Any] = {}
    if recs[0].target_image is not None:
      metadata["target_image"] = np.stack([self._load(r.target_image) for r in recs])
    keys = sorted({k for r in recs for k in r.metadata})
    for key in keys:
      metadata[key] = _batch_values([r.metadata.get(key) for r in recs])
    empty = np.zeros((0, self._height, self._width, 3), np.uint8)
    sources = [np.stack([self._load(p) for p in r.source_images]) if r.source_images else empty
               for r in recs]
    return PromptBatch(prompts=[r.prompt for r in recs], metadata=metadata,
                       source_images=sources, indices=np.asarray(indices, np.int64))

  def _load(self, path: str) -> np.ndarray:
    return load_image(path, self._height, self._width)


def _batch_values(values: list[Any]) -> Any:
  if any(v is None for v in values):
    return values
  try:
    arr = np.asarray(values)
  except ValueError:  # ragged nested lists
    return values
  return arr if arr.dtype.kind in "biuf" else values
