"""Flow-matching Euler scheduler as the GLM-Image pipeline drives it.

The schedule is a host-side function of static values (step count, resolution), so it is
plain numpy; `euler_step` is the only device-side piece and is jit-able.

Conventions reproduced from diffusers' GlmImagePipeline + FlowMatchEulerDiscreteScheduler:
- timesteps: `linspace(num_train_timesteps, 1, N + 1)[:-1]`, truncated to integers, float32.
  They are *not* shifted: only the sigmas go through the dynamic (resolution dependent) shift.
- sigmas: `shift(timesteps / num_train_timesteps)` with
  `mu = sqrt(image_seq_len / base_image_seq_len) * max_shift + base_shift`, then a final 0.
- the DiT is called with `timestep - 1` (`Schedule.model_timesteps`).
- step i: `x <- x + (sigma[i + 1] - sigma[i]) * v` in float32, cast to the velocity's dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from glmrl.models.scheduler import SchedulerConfig


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A sampling schedule. `sigmas` has one more entry than `timesteps` (the final 0)."""
  timesteps: np.ndarray  # [N] float32, the scheduler's timesteps
  sigmas: np.ndarray     # [N + 1] float32
  mu: float

  @property
  def num_steps(self) -> int:
    return int(self.timesteps.shape[0])

  @property
  def model_timesteps(self) -> np.ndarray:
    """What the pipeline feeds the DiT at each step: `timestep - 1` (float32)."""
    return self.timesteps - np.float32(1.0)


def image_seq_len(height: int, width: int, *, vae_scale_factor: int = 8, patch_size: int = 2) -> int:
  """Number of DiT image tokens for an image of `height` x `width` pixels."""
  for name, v in (("height", height), ("width", width)):
    if not isinstance(v, (int, np.integer)) or v <= 0:
      raise ValueError(f"{name}={v!r} must be a positive int")
  return ((height // vae_scale_factor) * (width // vae_scale_factor)) // (patch_size ** 2)


def calculate_shift(seq_len: int, cfg: SchedulerConfig) -> float:
  """The pipeline's mu (note: sqrt law, not the linear interpolation FLUX uses)."""
  return (seq_len / cfg.base_image_seq_len) ** 0.5 * cfg.max_shift + cfg.base_shift


def _shift_sigmas(sigmas: np.ndarray, mu: float, cfg: SchedulerConfig) -> np.ndarray:
  # Same float32 op sequence as the reference (python scalars stay weakly typed), so the
  # result is bit-identical.
  if not cfg.use_dynamic_shifting:
    return cfg.shift * sigmas / (1 + (cfg.shift - 1) * sigmas)
  if cfg.time_shift_type == "exponential":
    return math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1) ** 1.0)
  return mu / (mu + (1 / sigmas - 1) ** 1.0)


def glm_image_schedule(
    num_inference_steps: int,
    height: int,
    width: int,
    cfg: SchedulerConfig | None = None,
    *,
    vae_scale_factor: int = 8,
    patch_size: int = 2,
    timesteps: Sequence[float] | None = None,
    sigmas: Sequence[float] | None = None,
) -> Schedule:
  """Timesteps and sigmas exactly as `GlmImagePipeline.__call__` sets them.

  `timesteps` / `sigmas` override the defaults like the pipeline arguments of the same name.
  """
  cfg = SchedulerConfig.full() if cfg is None else cfg
  if timesteps is None:
    if isinstance(num_inference_steps, bool) or not isinstance(num_inference_steps, (int, np.integer)) \
        or num_inference_steps < 1:
      raise ValueError(f"num_inference_steps={num_inference_steps!r} must be a positive int")
    ts = np.linspace(cfg.num_train_timesteps, 1.0, num_inference_steps + 1)[:-1]
  else:
    ts = np.array(timesteps)
    if ts.ndim != 1 or ts.size == 0:
      raise ValueError(f"timesteps must be a non-empty 1-D sequence, got shape {ts.shape}")
  ts = ts.astype(np.int64).astype(np.float32)
  if sigmas is None:
    sg = ts / cfg.num_train_timesteps
  else:
    sg = np.array(sigmas).astype(np.float32)
    if sg.shape != ts.shape:
      raise ValueError(f"sigmas has shape {sg.shape} but timesteps has shape {ts.shape}")
  mu = calculate_shift(image_seq_len(height, width, vae_scale_factor=vae_scale_factor,
                                     patch_size=patch_size), cfg)
  sg = np.asarray(_shift_sigmas(sg, mu, cfg), dtype=np.float32)
  sg = np.concatenate([sg, np.zeros(1, np.float32)])
  return Schedule(timesteps=ts, sigmas=sg, mu=mu)


def euler_step(sample, velocity, sigma, sigma_next):
  """One Euler step of the flow ODE: `sample + (sigma_next - sigma) * velocity`.

  `sigma`, `sigma_next` are float32 scalars (traced or not). The update runs in float32 (the
  pipeline upcasts the velocity before stepping) and returns the velocity's dtype.
  """
  dt = jnp.asarray(sigma_next, jnp.float32) - jnp.asarray(sigma, jnp.float32)
  out = sample.astype(jnp.float32) + dt * velocity.astype(jnp.float32)
  return out.astype(velocity.dtype)


def euler_step_at(sigmas, step_index, sample, velocity):
  """`euler_step` with the sigma pair read from the schedule at a (traced) step index."""
  sigmas = jnp.asarray(sigmas, jnp.float32)
  return euler_step(sample, velocity, sigmas[step_index], sigmas[step_index + 1])
