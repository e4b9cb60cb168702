"""Reward-hacking monitors of a training run: what its images look like (`image_monitors`, every step, on device),
and a warning when the training reward rises while the held-out reward falls (`HackingWatch`).

The image statistics catch the usual hacks of image RL: oversaturation (mean HSV saturation), blank or flat
images (their fraction), and collapse onto one image
per prompt (the mean RMS distance between two images of one prompt, which falls towards 0 as the samples of a
prompt become one). An image is flat when each of its channels' standard deviation over the pixels is under
`NEAR_CONSTANT_STD`. JPEG size (detail, grids and noise compress badly) is measured on the host on the steps that
fetch the images anyway (`jpeg_kb`).
"""

from __future__ import annotations

import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from glmrl.rewards.image_stats import saturation

NEAR_CONSTANT_STD = 0.02  # pixel std on the [0, 1] scale under which an image counts as flat (2% of the range)


@functools.partial(jax.jit, static_argnames="group_size")
def image_monitors(images_BxHxWx3, group_size: int) -> dict:
  """{"monitor/saturation", "monitor/near_constant_frac", "monitor/pairwise_distance"} of uint8 images whose
  consecutive `group_size` rows are one prompt's samples (float32 scalars, on device)."""
  pixels_BxNx3 = images_BxHxWx3.reshape(images_BxHxWx3.shape[0], -1, 3).astype(jnp.float32) / 255.0
  x_BxD = pixels_BxNx3.reshape(pixels_BxNx3.shape[0], -1)
  # Flat: every channel nearly constant over the image (a uniform colour, not only grey).
  flat = jnp.max(jnp.std(pixels_BxNx3, axis=1), axis=1) < NEAR_CONSTANT_STD
  g = group_size
  x_PxGxD = x_BxD.reshape(-1, g, x_BxD.shape[1])
  # |a - b|^2 = |a|^2 + |b|^2 - 2 a.b over each prompt's pairs, the D-long images never copied per pair; centred
  # on the prompt's mean image first (distances do not change), so the three terms are small and do not cancel.
  x_PxGxD = x_PxGxD - jnp.mean(x_PxGxD, axis=1, keepdims=True)
  sq_PxG = jnp.sum(jnp.square(x_PxGxD), axis=2)
  gram_PxGxG = jnp.einsum("pgd,phd->pgh", x_PxGxD, x_PxGxD)
  dist_PxGxG = jnp.sqrt(jnp.maximum(sq_PxG[:, :, None] + sq_PxG[:, None, :] - 2.0 * gram_PxGxG, 0.0)
                        / x_BxD.shape[1])
  # The diagonal is 0: its rounding (|a|^2 + |a|^2 - 2 a.a ~ 1e-7, through the sqrt ~ 3e-4) is dropped.
  off_diagonal = 1.0 - jnp.eye(g, dtype=jnp.float32)
  pairwise = jnp.sum(dist_PxGxG * off_diagonal, axis=(1, 2)) / max(g * (g - 1), 1)
  return {"monitor/saturation": jnp.mean(saturation(images_BxHxWx3, None, None)),
          "monitor/near_constant_frac": jnp.mean(flat.astype(jnp.float32)),
          "monitor/pairwise_distance": jnp.mean(pairwise)}


def jpeg_kb(images_BxHxWx3: np.ndarray, quality: int = 95) -> float:
  """Mean JPEG size in kB of host uint8 images at `quality` (the jpeg_compressibility reward's encoding)."""
  sizes = []
  for image in images_BxHxWx3:
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image)).save(buffer, format="JPEG", quality=quality)
    sizes.append(buffer.tell() / 1000.0)
  return float(np.mean(sizes))


def eval_reward_key(prefix: str) -> str:
  """The held-out reward that matches a policy's training reward `{prefix}reward/mean`: config.rewards'
  (`eval/reward/mean`) for the AR policy, `eval/<prefix>reward/mean` for the others."""
  return "eval/" + ("" if prefix in ("", "ar/") else prefix) + "reward/mean"


class HackingWatch:
  """One warning line when, for `patience` evaluations in a row, a policy's mean training reward since the
  previous evaluation rose while its held-out reward fell (the reward is being gamed, not earned)."""

  def __init__(self, prefixes, patience: int):
    self.patience = patience
    self.prefixes = tuple(prefixes)
    self.train = {p: [] for p in self.prefixes}
    self.last = {p: None for p in self.prefixes}   # (train mean, eval reward) at the previous evaluation
    self.run = {p: 0 for p in self.prefixes}

  def step(self, scalars: dict) -> None:
    for p in self.prefixes:
      value = scalars.get(f"{p}reward/mean")
      if value is not None and np.isfinite(value):
        self.train[p].append(float(value))

  def evaluated(self, step: int, scalars: dict) -> tuple[dict, list[str]]:
    """(metrics `monitor/<prefix>hacking_run`, warning lines) after an evaluation at `step`."""
    metrics, warnings = {}, []
    for p in self.prefixes:
      held_out = scalars.get(eval_reward_key(p))
      if held_out is None or not self.train[p]:
        continue
      train = float(np.mean(self.train[p]))
      self.train[p] = []
      previous, self.last[p] = self.last[p], (train, float(held_out))
      if previous is not None:
        diverging = train > previous[0] and held_out < previous[1]
        self.run[p] = self.run[p] + 1 if diverging else 0
        if self.patience and self.run[p] == self.patience:
          warnings.append(
              f"possible reward hacking at step {step}: for {self.patience} evaluations the training reward "
              f"({p}reward/mean, now {train:.4g}) rose while the held-out reward ({eval_reward_key(p)}, now "
              f"{held_out:.4g}) fell; look at the samples and the monitor/* metrics")
      metrics[f"monitor/{p}hacking_run"] = float(self.run[p])
    return metrics, warnings
