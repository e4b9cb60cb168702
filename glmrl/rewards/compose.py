"""Weighted composition of registered rewards, with optional per-group standardisation.

Config: a list of entries `{"name": str, "weight": float}` with the optional
keys `"normalize": bool` (standardise this reward within each group of
`group_size` consecutive rows before weighting) and `"kwargs": dict` (passed to
the reward function, or to the factory of a model-backed reward, which is built
once here). The components returned for logging are the raw scores, before
normalisation and weighting.

Model-backed rewards may need host-side inputs derived from the prompts (CLIP text
embeddings): `prepare(prompts, metadata)` returns them as arrays, to be merged into
the metadata given to `jax_scores` (the composer's own `__call__` does this).
"""

import inspect
import math
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from glmrl.grpo import advantages as advantages_lib
from glmrl.rewards import registry

ENTRY_KEYS = ("name", "weight", "normalize", "kwargs")


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

  def __init__(self, config: Sequence[Any], *, group_size: int | None = None, std_eps=advantages_lib.STD_EPS):
    if isinstance(config, (str, bytes)) or not isinstance(config, Sequence) or not config:
      raise ValueError(f"reward config {config!r} must be a non-empty list of {{name, weight}} entries")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer))
                                   or group_size <= 0):
      raise ValueError(f"group_size={group_size!r} must be a positive integer or None")
    self.group_size = None if group_size is None else int(group_size)
    self.std_eps = float(std_eps)  # near-constant threshold of the per-group normalisation (grpo.std_eps)
    self.entries = tuple(self._parse_entry(i, e) for i, e in enumerate(config))
    seen = [e["name"] for e in self.entries]
    dupes = sorted({n for n in seen if seen.count(n) > 1})
    if dupes:
      raise ValueError(f"reward config lists {dupes} more than once; give one entry per reward")
    self._jax_scores_jit = jax.jit(self.jax_scores)

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
    try:
      if reward.model_backed:
        inspect.signature(reward.fn).bind(**kwargs)
      else:
        inspect.signature(reward.fn).bind(None, None, None, **kwargs)
    except TypeError as e:
      raise ValueError(f"reward {reward.name!r}: bad kwargs {dict(kwargs)!r}: {e}") from e
    built = reward.build(**kwargs)
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

  def host_scores(self, images, prompts: Sequence[str], metadata: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Raw scores of the host-side rewards only, on numpy inputs."""
    images = np.asarray(images)
    return {e["name"]: np.asarray(e["fn"](images, prompts, metadata), np.float32)
            for e in self.entries if not e["reward"].pure_jax}

  def combine(self, components: Mapping[str, Any]):
    """Weighted sum of the components, each standardised per group first where configured
    (`group_normalize` with this composer's near-constant threshold `std_eps`)."""
    total = 0.0
    for e in self.entries:
      s = jnp.asarray(components[e["name"]], jnp.float32)
      if e["normalize"]:
        s = group_normalize(s, self.group_size, self.std_eps)
      total = total + e["weight"] * s
    return total

  def __call__(self, images, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None):
    """Returns (total float32[B], {name: raw float32[B]}) as numpy arrays."""
    if not hasattr(images, "shape"):
      images = np.asarray(images)
    registry.check_images(images, "composition")
    batch = images.shape[0]
    if isinstance(prompts, str):
      raise ValueError(f"prompts must be a list of {batch} strings, got the single string {prompts!r}")
    if len(prompts) != batch:
      raise ValueError(f"got {len(prompts)} prompts for {batch} images")
    if self.group_size is not None and batch % self.group_size:
      raise ValueError(f"batch of {batch} images is not divisible by group_size={self.group_size}")
    metadata = dict(metadata or {})
    metadata.update(self.prepare(prompts, metadata))
    array_metadata = {k: v for k, v in metadata.items()
                      if isinstance(v, (np.ndarray, jax.Array))
                      and (jnp.issubdtype(v.dtype, jnp.number) or v.dtype == np.bool_)}
    scores = {}
    if any(e["reward"].pure_jax for e in self.entries):
      scores.update(jax.device_get(self._jax_scores_jit(images, array_metadata)))
    scores.update(self.host_scores(images, prompts, metadata))
    for name, s in scores.items():
      if np.shape(s) != (batch,):
        raise ValueError(f"reward {name!r} returned shape {np.shape(s)}, expected ({batch},)")
    components = {e["name"]: np.asarray(scores[e["name"]], np.float32) for e in self.entries}
    total = np.asarray(self.combine(components), np.float32)
    return total, components
