"""Input validation shared by the GRPO functions (host-side, before tracing work)."""

import jax
import numpy as np


def is_static(x) -> bool:
  """True for Python/numpy scalars whose value can be checked now (not tracers)."""
  return not isinstance(x, jax.core.Tracer) and np.ndim(x) == 0


def choice(name: str, value, allowed):
  if value not in allowed:
    raise ValueError(f"{name}={value!r} is not one of {sorted(allowed)}")


def same_shape(name: str, x, ref_name: str, ref):
  if tuple(x.shape) != tuple(ref.shape):
    raise ValueError(
        f"{name} has shape {tuple(x.shape)} but {ref_name} has shape {tuple(ref.shape)}; "
        "they must match exactly (no broadcasting)")
