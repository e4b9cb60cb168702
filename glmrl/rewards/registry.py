"""Registry of named reward functions.

A reward is `fn(images, prompts, metadata, **kwargs) -> scores[B]`: `images`
uint8 [B, H, W, 3] (jax or numpy), `prompts` B strings, `metadata` a dict of
batched values (e.g. `target_image` uint8 [B, H, W, 3]). A `pure_jax` reward
is traceable under `jax.jit`; inside jit it receives `prompts=None` and only the
array-valued metadata. Other rewards run on the host with numpy inputs.
"""

import dataclasses
from typing import Any, Callable

import numpy as np

RewardFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Reward:
  name: str
  fn: RewardFn
  pure_jax: bool

  def __call__(self, images, prompts, metadata, **kwargs):
    return self.fn(images, prompts, metadata, **kwargs)


_REGISTRY: dict[str, Reward] = {}


def register(name: str, fn: RewardFn, *, pure_jax: bool, replace: bool = False) -> RewardFn:
  """Registers `fn` under `name` and returns `fn`; an existing name needs `replace=True`."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"reward name {name!r} must be a non-empty string")
  if not callable(fn):
    raise ValueError(f"reward {name!r}: fn {fn!r} is not callable")
  if not isinstance(pure_jax, bool):
    raise ValueError(f"reward {name!r}: pure_jax={pure_jax!r} must be a bool")
  if name in _REGISTRY and not replace:
    raise ValueError(f"reward {name!r} is already registered (pass replace=True to override)")
  _REGISTRY[name] = Reward(name=name, fn=fn, pure_jax=pure_jax)
  return fn


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
