"""Input validation shared by the GRPO functions (host-side, before tracing work)."""

import jax
import jax.numpy as jnp
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


def per_sample(name: str, a, x):
  """A scalar, or a [B] vector reshaped to [B, 1, ..., 1] to broadcast against x [B, ...] (float32)."""
  a = jnp.asarray(a, jnp.float32)
  if a.ndim == 0:
    return a
  if tuple(a.shape) != (x.shape[0],):
    raise ValueError(f"{name} has shape {tuple(a.shape)}; expected a scalar or ({x.shape[0]},), one per sample")
  return a.reshape((-1,) + (1,) * (x.ndim - 1))


def latent_axes(x):
  """The non-batch axes of x [B, ...]."""
  if x.ndim < 1:
    raise ValueError("latents must be [B, ...] with a leading batch axis, got a scalar")
  return tuple(range(1, x.ndim))
