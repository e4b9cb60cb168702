"""Weighted composition of registered rewards, with optional per-group standardisation.

Config: a list of entries `{"name": str, "weight": float}` with the optional
keys `"normalize": bool` (standardise this reward within each group of
`group_size` consecutive rows before weighting) and `"kwargs": dict` (passed to
the reward function, or to the factory of a model-backed reward, which is built
once here). The components returned for logging are the raw scores, before
normalisation and weighting.

Model-backed rewards may need host-side inputs derived from the prompts (CLIP text
embeddings): `prepare(prompts, metadata)` returns them as arrays, to be merged into
the metadata given to `jax_scores`.

`score` is the one way a batch is scored, in training and in evaluation: host inputs prepared,
host-side rewards run on fetched images, pure-JAX rewards and the weighted sum in one jitted
program; the result stays on device. `__call__` is `score` fetched to numpy.
"""

import math
import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from glmrl.grpo import advantages as advantages_lib
from glmrl.rewards import registry

ENTRY_KEYS = ("name", "weight", "normalize", "kwargs")


def config_entries(rewards, normalize_all: bool = False) -> list[dict]:
  """A config's reward entries as plain dicts (ConfigDicts converted), each standardised per group when
  `normalize_all` (config.normalize_rewards_per_group): what the run's composer and --mode=compile both score."""
  entries = [dict(e.to_dict() if hasattr(e, "to_dict") else e) for e in rewards]
  return [dict(e, normalize=True) for e in entries] if normalize_all else entries


def weighted_total(entries, components: Mapping[str, Any], group_size: int | None, std_eps: float):
  """sum of weight * score over `entries` ({name, weight, normalize}), each score standardised per group of
  `group_size` first where its entry says `normalize` (`group_normalize`)."""
  total = 0.0
  for e in entries:
    s = jnp.asarray(components[e["name"]], jnp.float32)
    if e.get("normalize", False):
      s = group_normalize(s, group_size, std_eps)
    total = total + float(e["weight"]) * s
  return total


def group_normalize(scores, group_size: int, std_eps=advantages_lib.STD_EPS):
  """Standardises scores[B] within consecutive groups; constant and near-constant groups give exactly 0.

  The same standardisation as the group advantages (`glmrl.grpo.group_advantages`, scale="group"):
  unbiased std, and a group whose std is at most std_eps times its largest |score| counts as constant.
  """
  if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size <= 0:
    raise ValueError(f"group_size={group_size!r} must be a positive integer")
  scores = jnp.asarray(scores, jnp.float32)
  if scores.ndim != 1 or scores.shape[0] % group_size:
    raise ValueError(f"scores of shape {scores.shape} is not a vector whose length is divisible by "
                     f"group_size={group_size}")
  if group_size == 1:  # a group of one is constant
    return jnp.zeros_like(scores)
  return advantages_lib.group_advantages(scores, int(group_size), scale="group", estimator="grpo",
                                         std_eps=std_eps)


class RewardComposer:
  """Scores a batch with several rewards: `(images, prompts, metadata) -> (total[B], {name: scores[B]})`."""

  def __init__(self, config: Sequence[Any], *, group_size: int | None = None, std_eps=advantages_lib.STD_EPS,
               sharding=None):
    """`sharding`: where model-backed rewards put their weights (default: the first device); a run
    passes its mesh's replicated sharding so its jitted programs can read them."""
    if isinstance(config, (str, bytes)) or not isinstance(config, Sequence) or not config:
      raise ValueError(f"reward config {config!r} must be a non-empty list of {{name, weight}} entries")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer))
                                   or group_size <= 0):
      raise ValueError(f"group_size={group_size!r} must be a positive integer or None")
    self.group_size = None if group_size is None else int(group_size)
    self.std_eps = float(std_eps)  # near-constant threshold of the per-group normalisation (grpo.std_eps)
    self.sharding = sharding
    self.entries = tuple(self._parse_entry(i, e) for i, e in enumerate(config))
    seen = [e["name"] for e in self.entries]
    dupes = sorted({n for n in seen if seen.count(n) > 1})
    if dupes:
      raise ValueError(f"reward config lists {dupes} more than once; give one entry per reward")
    self._device_scores_jit = jax.jit(self._device_scores)

  def _parse_entry(self, i: int, entry: Any) -> dict[str, Any]:
    if hasattr(entry, "to_dict"):  # ml_collections.ConfigDict
      entry = entry.to_dict()
    if not isinstance(entry, Mapping):
      raise ValueError(f"reward config entry {i} ({entry!r}) must be a mapping with name and weight")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
      raise ValueError(f"reward config entry {i}: unknown key(s) {unknown}; allowed: {list(ENTRY_KEYS)} "
                       "(reward arguments go under 'kwargs')")
    if "name" not in entry or "weight" not in entry:
      raise ValueError(f"reward config entry {i} ({dict(entry)!r}) needs both 'name' and 'weight'")
    reward = registry.get(entry["name"])
    weight = entry["weight"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.number)) or not math.isfinite(weight):
      raise ValueError(f"reward {reward.name!r}: weight={weight!r} must be a finite number")
    normalize = entry.get("normalize", False)
    if not isinstance(normalize, bool):
      raise ValueError(f"reward {reward.name!r}: normalize={normalize!r} must be a bool")
    if normalize and self.group_size is None:
      raise ValueError(f"reward {reward.name!r} has normalize=True, which needs group_size")
    kwargs = entry.get("kwargs") or {}
    if hasattr(kwargs, "to_dict"):
      kwargs = kwargs.to_dict()
    if not isinstance(kwargs, Mapping):
      raise ValueError(f"reward {reward.name!r}: kwargs={kwargs!r} must be a mapping")
    problem = reward.kwargs_problem(kwargs)
    if problem:
      raise ValueError(f"{problem} (kwargs {dict(kwargs)!r})")
    built = reward.build(self.sharding, **kwargs)
    return {"name": reward.name, "reward": reward, "weight": float(weight), "normalize": normalize,
            "kwargs": dict(kwargs), "fn": built.fn, "prepare": built.prepare}

  @property
  def names(self) -> list[str]:
    return [e["name"] for e in self.entries]

  def prepare(self, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None) -> dict[str, jax.Array]:
    """Host-side inputs of the model-backed rewards ({key: array [B, ...]}), to add to the metadata."""
    if isinstance(prompts, str):
      raise ValueError(f"prompts must be a list of strings, got the single string {prompts!r}")
    metadata = dict(metadata or {})
    out: dict[str, jax.Array] = {}
    for e in self.entries:
      if e["prepare"] is None:
        continue
      arrays = e["prepare"](list(prompts), metadata)
      if not isinstance(arrays, Mapping):
        raise ValueError(f"reward {e['name']!r}: prepare returned {type(arrays).__name__}, not a mapping")
      clash = sorted(k for k in arrays if k in out or k in metadata)
      if clash:
        raise ValueError(f"reward {e['name']!r}: prepare's key(s) {clash} are already in the metadata")
      for key, value in arrays.items():
        value = jnp.asarray(value)
        if value.ndim == 0 or value.shape[0] != len(prompts):
          raise ValueError(f"reward {e['name']!r}: prepare gave {key!r} of shape {value.shape} for "
                           f"{len(prompts)} prompts")
        out[key] = value
    return out

  def jax_scores(self, images, metadata: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Raw scores of the pure-JAX rewards only; traceable (prompts are passed as None)."""
    return {e["name"]: jnp.asarray(e["fn"](images, None, metadata), jnp.float32)
            for e in self.entries if e["reward"].pure_jax}

  def host_scores(self, images, prompts: Sequence[str], metadata: Mapping[str, Any],
                  seconds: dict | None = None) -> dict[str, np.ndarray]:
    """Raw scores of the host-side rewards only, on numpy inputs; each one's seconds are added to `seconds`."""
    images = np.asarray(images)
    out = {}
    for e in self.entries:
      if e["reward"].pure_jax:
        continue
      t0 = time.perf_counter()
      out[e["name"]] = np.asarray(e["fn"](images, prompts, metadata), np.float32)
      if seconds is not None:
        seconds[e["name"]] = seconds.get(e["name"], 0.0) + time.perf_counter() - t0
    return out

  @property
  def has_host_rewards(self) -> bool:
    return any(not e["reward"].pure_jax for e in self.entries)

  def combine(self, components: Mapping[str, Any]):
    """Weighted sum of the components, each standardised per group first where configured
    (`group_normalize` with this composer's near-constant threshold `std_eps`)."""
    return weighted_total(self.entries, components, self.group_size, self.std_eps)

  def host_components(self, images, prompts, metadata, seconds: dict | None = None, first_row: int = 0) -> dict:
    """Host-side rewards as device arrays; in a multi-process run each process scores its own samples
    (the rows of the images its devices hold) and the scores are assembled like the images (`host_layout`).
    `first_row`: the batch row of `images[0]` where they are a part of the batch (a served reward's error names its
    batch rows; across processes the rows are this process's own, as for a whole batch)."""
    if not isinstance(images, jax.Array) or images.is_fully_addressable:
      with registry.rows_from(first_row):
        scores = self.host_scores(images, prompts, metadata, seconds)
      return {k: jnp.asarray(v) for k, v in scores.items()}
    spans = sorted({(s.index[0].start or 0, s.index[0].stop or images.shape[0]): s
                    for s in images.addressable_shards}.items())
    rows = np.concatenate([np.arange(a, b) for (a, b), _ in spans])
    local_images = np.concatenate([np.asarray(shard.data) for _, shard in spans])
    local_meta = {k: (v[rows] if isinstance(v, np.ndarray) else [v[i] for i in rows]) for k, v in metadata.items()
                  if isinstance(v, (np.ndarray, list, tuple)) and len(v) == images.shape[0]}
    scores = self.host_scores(local_images, [prompts[i] for i in rows], local_meta, seconds)
    return {k: jax.make_array_from_process_local_data(self.host_layout(images), v, (images.shape[0],))
            for k, v in scores.items()}

  def host_layout(self, images):
    """Where `host_components(images, ...)` puts its scores: None (the default device) or the images' rows'
    sharding across processes."""
    if not isinstance(images, jax.Array) or images.is_fully_addressable:
      return None
    return jax.sharding.NamedSharding(images.sharding.mesh, jax.sharding.PartitionSpec(images.sharding.spec[0]))

  def _device_scores(self, host_components, images, metadata):
    components = dict(self.jax_scores(images, metadata))
    components.update(host_components)
    batch = images.shape[0]
    for name, v in components.items():
      if tuple(v.shape) != (batch,):  # static shapes: checked while tracing
        raise ValueError(f"reward {name!r} returned shape {tuple(v.shape)}, expected ({batch},)")
    return self.combine(components), components

  def inputs(self, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None) -> dict:
    """The per-sample metadata every reward reads: `metadata` plus `prepare`'s host inputs."""
    metadata = dict(metadata or {})
    metadata.update(self.prepare(prompts, metadata))
    return metadata

  def score(self, images, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None):
    """(total float32[B], {name: raw float32[B]}) as device arrays.

    `metadata`: per-sample values ({key: array [B, ...] or list of B}); the numeric arrays reach the
    pure-JAX rewards, everything reaches the host-side ones.
    """
    if not hasattr(images, "shape"):
      images = np.asarray(images)
    self.check_batch(images, prompts)
    return self.score_inputs(images, prompts, self.inputs(prompts, metadata))

  def check_batch(self, images, prompts: Sequence[str]) -> None:
    registry.check_images(images, "composition")
    batch = images.shape[0]
    if isinstance(prompts, str):
      raise ValueError(f"prompts must be a list of {batch} strings, got the single string {prompts!r}")
    if len(prompts) != batch:
      raise ValueError(f"got {len(prompts)} prompts for {batch} images")
    if self.group_size is not None and batch % self.group_size:
      raise ValueError(f"batch of {batch} images is not divisible by group_size={self.group_size}")

  def score_inputs(self, images, prompts: Sequence[str], metadata: dict, host_components: dict | None = None,
                   seconds: dict | None = None):
    """`score` of a checked batch from `inputs(prompts, ...)`'s metadata; `host_components`: the host-side rewards'
    scores where they were scored already (`glmrl.train.reward_stream`, as `host_components` lays them out), else
    they are scored here, each one's seconds added to `seconds`."""
    if not hasattr(images, "shape"):
      images = np.asarray(images)
    # Host arrays stay numpy: jit places them on the images' mesh (also across processes).
    array_metadata = {k: v for k, v in metadata.items()
                      if isinstance(v, (np.ndarray, jax.Array))
                      and (jnp.issubdtype(v.dtype, jnp.number) or v.dtype == np.bool_)}
    if host_components is None:
      host_components = self.host_components(images, prompts, metadata, seconds) if self.has_host_rewards else {}
    total, components = self._device_scores_jit(host_components, images, array_metadata)
    return total, {e["name"]: components[e["name"]] for e in self.entries}  # jit returns dicts key-sorted

  def __call__(self, images, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None):
    """`score`, as numpy arrays."""
    total, components = self.score(images, prompts, metadata)
    return np.asarray(total, np.float32), {k: np.asarray(v, np.float32) for k, v in components.items()}
