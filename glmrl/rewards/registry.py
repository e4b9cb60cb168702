"""Registry of named reward functions.

A reward is `fn(images, prompts, metadata, **kwargs) -> scores[B]`: `images`
uint8 [B, H, W, 3] (jax or numpy), `prompts` B strings, `metadata` a dict of
batched values (e.g. `target_image` uint8 [B, H, W, 3]). A `pure_jax` reward
is traceable under `jax.jit`; inside jit it receives `prompts=None` and only the
array-valued metadata. Other rewards run on the host with numpy inputs.

Model-backed rewards (CLIP score, PickScore, the aesthetic predictor, ...) need weights loaded
once, from paths in the reward config. They register a factory instead of a function:

    register_factory("clip_score", clip_score_factory, pure_jax=True)

`RewardComposer` calls `factory(**kwargs)` once per config entry (kwargs from the entry, e.g.
`{"ckpt_dir": ...}`); the factory loads the model and returns either the reward fn
`fn(images, prompts, metadata) -> scores[B]` (kwargs already bound) or a `ModelReward(fn,
prepare)`. `prepare(prompts, metadata) -> {key: array [B, ...]}` runs on the host before scoring
and its arrays are added to the metadata under those keys: that is how a pure-JAX reward gets
prompt-derived inputs (e.g. cached CLIP text embeddings) inside jit, where `prompts` is None.
Keys are the reward's own (prefixed with its name by convention); the composer rejects clashes.
A factory that loads weights takes a keyword `sharding` (a jax Sharding, or None for the first
device) and puts them there; the composer passes the run's (replicated on the training mesh). Such
factories should cache loaded weights per (path, sharding) so rewards sharing a model load it once.
"""

import contextlib
import contextvars
import dataclasses
import inspect
from typing import Any, Callable, Mapping, Sequence

import numpy as np

RewardFn = Callable[..., Any]

# The batch row of the first image a host-side reward is given in this thread: 0, except while the rollout scores
# its batch a decoder call at a time (`glmrl.train.reward_stream`), so that an error naming an image names its row
# of the batch either way (`first_row()`; the remote rewards' errors read it).
_FIRST_ROW = contextvars.ContextVar("glmrl_reward_first_row", default=0)


@dataclasses.dataclass(frozen=True)
class ModelReward:
  """What a model-backed reward's factory returns: the scoring fn and an optional host `prepare`."""
  fn: RewardFn
  prepare: Callable[[Sequence[str], Any], Mapping[str, Any]] | None = None

  def __post_init__(self):
    if not callable(self.fn):
      raise ValueError(f"ModelReward fn {self.fn!r} is not callable")
    if self.prepare is not None and not callable(self.prepare):
      raise ValueError(f"ModelReward prepare {self.prepare!r} is not callable")


@dataclasses.dataclass(frozen=True)
class AbstractReward:
  """A model-backed reward's model as shapes, for `--mode=compile` (no weights read): `module` built abstractly
  (`nnx.eval_shape`), `make(module)` the reward of that module once its parameters are given (traced ones
  included), `prepared` what its `prepare` adds per prompt ({key: (shape of one row, dtype)})."""
  module: Any
  make: Callable[[Any], ModelReward]
  prepared: Mapping[str, tuple[tuple[int, ...], Any]]


@dataclasses.dataclass(frozen=True)
class Reward:
  """A registered reward; for a model-backed one (`model_backed=True`) `fn` is its factory."""
  name: str
  fn: RewardFn
  pure_jax: bool
  model_backed: bool = False
  needs: tuple[str, ...] = ()  # metadata keys every prompt must supply (e.g. "target_image")
  # A model-backed pure-JAX reward's `AbstractReward` from its config kwargs (the factory's, without `sharding`);
  # None where --mode=compile cannot build it.
  abstract: Callable[..., AbstractReward] | None = None

  def __call__(self, images, prompts, metadata, **kwargs):
    if self.model_backed:
      raise ValueError(f"reward {self.name!r} is model-backed: build it once with .build(**kwargs) "
                       "(RewardComposer does) and call the result")
    return self.fn(images, prompts, metadata, **kwargs)

  def kwargs_problem(self, kwargs: Mapping[str, Any], *, complete: bool = True) -> str | None:
    """Why `kwargs` cannot configure this reward (one line listing what it takes), or None. `complete`: every
    argument without a default must be given (not when only the names are known, e.g. --mode=compile)."""
    params = list(inspect.signature(self.fn).parameters.values())
    if not self.model_backed:
      params = params[3:]  # images, prompts, metadata
    elif self.places_weights:
      params = [p for p in params if p.name != "sharding"]  # the composer's, never the config's
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes = [p.name for p in named]
    unknown = sorted(set(kwargs) - set(takes))
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in params):
      return f"reward {self.name!r} takes no argument {', '.join(map(repr, unknown))}; it takes {takes or 'none'}"
    missing = [p.name for p in named if p.default is p.empty and p.name not in kwargs]
    if missing and complete:
      return f"reward {self.name!r} needs {', '.join(map(repr, missing))} (it takes {takes})"
    return None

  @property
  def places_weights(self) -> bool:
    """A model-backed reward whose factory takes `sharding` (where its weights go)."""
    return self.model_backed and "sharding" in inspect.signature(self.fn).parameters

  def build(self, sharding=None, **kwargs) -> ModelReward:
    """The ready-to-call reward: the factory's result for a model-backed reward (its weights on
    `sharding` when it loads any), else `fn` with `kwargs` bound."""
    if not self.model_backed:
      fn, bound = self.fn, dict(kwargs)
      return ModelReward(lambda images, prompts, metadata: fn(images, prompts, metadata, **bound))
    built = self.fn(**kwargs, sharding=sharding) if self.places_weights else self.fn(**kwargs)
    if isinstance(built, ModelReward):
      return built
    if callable(built):
      return ModelReward(built)
    raise ValueError(f"reward {self.name!r}: factory returned {built!r}, not a reward fn or ModelReward")


_REGISTRY: dict[str, Reward] = {}


def register(name: str, fn: RewardFn, *, pure_jax: bool, replace: bool = False, needs: tuple[str, ...] = ()
             ) -> RewardFn:
  """Registers `fn` under `name` and returns `fn`; an existing name needs `replace=True`. `needs`: the
  metadata keys it reads of every prompt, checked against the prompt files before a run builds anything."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"reward name {name!r} must be a non-empty string")
  if not callable(fn):
    raise ValueError(f"reward {name!r}: fn {fn!r} is not callable")
  if not isinstance(pure_jax, bool):
    raise ValueError(f"reward {name!r}: pure_jax={pure_jax!r} must be a bool")
  if name in _REGISTRY and not replace:
    raise ValueError(f"reward {name!r} is already registered (pass replace=True to override)")
  _REGISTRY[name] = Reward(name=name, fn=fn, pure_jax=pure_jax, needs=tuple(needs))
  return fn


def register_factory(name: str, factory: Callable[..., Any], *, pure_jax: bool,
                     replace: bool = False, needs: tuple[str, ...] = (),
                     abstract: Callable[..., AbstractReward] | None = None) -> Callable[..., Any]:
  """Registers a model-backed reward: `factory(**kwargs)` -> reward fn or ModelReward (see module doc);
  `abstract(**kwargs)` -> its `AbstractReward`, for --mode=compile."""
  register(name, factory, pure_jax=pure_jax, replace=replace, needs=needs)
  _REGISTRY[name] = dataclasses.replace(_REGISTRY[name], model_backed=True, abstract=abstract)
  return factory


def unregister(name: str) -> None:
  if name not in _REGISTRY:
    raise ValueError(f"unknown reward {name!r}; registered rewards: {names()}")
  del _REGISTRY[name]


def get(name: str) -> Reward:
  if name not in _REGISTRY:
    raise ValueError(f"unknown reward {name!r}; registered rewards: {names()}")
  return _REGISTRY[name]


def names() -> list[str]:
  return sorted(_REGISTRY)


@contextlib.contextmanager
def rows_from(first: int):
  """Host-side rewards called within are given the batch's rows from `first` on."""
  token = _FIRST_ROW.set(int(first))
  try:
    yield
  finally:
    _FIRST_ROW.reset(token)


def first_row() -> int:
  return _FIRST_ROW.get()


def check_images(images, name: str) -> None:
  """Shape/dtype check shared by the built-in rewards (static, so fine under jit)."""
  shape = tuple(images.shape)
  if len(shape) != 4 or shape[-1] != 3:
    raise ValueError(f"reward {name!r}: images must be [B, H, W, 3], got shape {shape}")
  if np.dtype(images.dtype) != np.uint8:
    raise ValueError(f"reward {name!r}: images must be uint8, got dtype {images.dtype}")


def require_metadata(metadata, key: str, name: str):
  if metadata is None or key not in metadata:
    keys = sorted(metadata) if metadata else []
    raise ValueError(f"reward {name!r} needs metadata[{key!r}]; metadata has keys {keys}")
  return metadata[key]
