"""What a trained policy is to the run: its settings under one name each, the rollout it asks for, and the
small interface the Trainer, the rollout, checkpoints, evaluation and `--mode=compile` call.

A policy module (`ar.py`, `decoder.py`) holds its rollout batch, its loss and its update, and one object
implementing `Policy`; a third policy (or a second decoder algorithm) is one more such module, listed in
`registry.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from glmrl.models import lora as lora_lib
from glmrl.policy.ema import EmaSettings


@dataclasses.dataclass(frozen=True)
class Settings:
  """A policy's settings, read from its config section once (`Policy.settings`)."""
  group_size: int          # rows one of its groups compares: token grids per prompt, or samples per grid
  lora: lora_lib.LoraConfig
  optim: Any               # the config section of its optimizer (`optimizer.make_optimizer`)
  num_iterations: int      # updates per rollout
  beta: float              # KL weight (> 0: a reference policy is kept)
  micro_batch_size: int    # rows per micro-batch of its update (0: the whole batch)
  ema: EmaSettings = EmaSettings()  # the moving average of its trained parameters (off by default)
  advantage_scale: str = "group"    # what divides its advantages: the group's reward std, the batch's, or none


def lora_alpha(section) -> float:
  """A LoRA config section's alpha: as given, or unset (0) the rank (scale alpha / rank = 1)."""
  return float(section.alpha) or float(section.rank)


@dataclasses.dataclass(frozen=True)
class Request:
  """The rollout a policy asks for: token grids per prompt, decoder samples per grid, an SDE window (Flow-GRPO)
  or the clean latents of an ODE rollout (DiffusionNFT, AWM) under the decoder's training steps and guidance."""
  grids_per_prompt: int = 1
  samples_per_grid: int = 1
  sde: bool = False
  clean: bool = False

  @property
  def trains_decoder(self) -> bool:
    """The rollout decodes with the decoder's training steps and guidance (an SDE window or clean latents)."""
    return self.sde or self.clean

  @property
  def images_per_prompt(self) -> int:
    return self.grids_per_prompt * self.samples_per_grid

  def __or__(self, other: "Request") -> "Request":
    """One rollout serving both requests (each policy asks for its own axis)."""
    return Request(max(self.grids_per_prompt, other.grids_per_prompt),
                   max(self.samples_per_grid, other.samples_per_grid), self.sde or other.sde,
                   self.clean or other.clean)


class Policy(Protocol):
  """One trained policy (see the module docstring). Attributes name where its state lives."""
  name: str            # "ar" | "decoder": config.train.policies' word, the key of the run's states
  component: str       # the pipeline model it trains ("ar" | "dit")
  params_item: str     # checkpoint items of its trained parameters and optimizer state
  opt_item: str
  ema_item: str        # checkpoint item of its moving average (saved when its settings keep one)
  adapters_file: str   # checkpoint record of its LoRA adapters and their base
  lora_section: str    # its LoRA settings' config path, for messages
  salt: int            # separates its adapters' initial A from other models' drawn from one seed
  full_filter: Any     # what full fine-tuning trains of its model (nnx filter)
  micro_batch_key: str  # its micro-batch size's config path, for messages

  def rows_per_prompt(self, request: Request) -> int:
    """Rows of its update's batch per prompt of the rollout."""

  def rewards(self, config, request: Request) -> tuple:
    """(its reward entries, rows a per-group reward normalisation spans)."""

  def settings(self, config) -> Settings: ...

  def request(self, config) -> Request: ...

  def prefix(self, policies: tuple[str, ...]) -> str:
    """Its metrics' prefix among the run's `policies`."""

  def group_rewards(self, total_B, request: Request):
    """(rewards of its rows, rows per group) from the images' total rewards [B]."""

  def rollout_batch(self, config, sampled, advantages, keep):
    """Its update's inputs from the rollout (`rollout.Sampled`), learner log-probs NaN until the first update."""

  def update_shape(self, sampled) -> tuple:
    """What its compiled update depends on besides the config (static)."""

  def make_update(self, state, config, shape):
    """Its update jitted once: fn(trainable, frozen, opt_state, batch, reference, first)."""

  def after_first(self, batch, outputs, config) -> tuple[Any, dict]:
    """(batch with the first update's learner log-probs, diagnostics of them) for the later iterations."""

  def anchors(self, state):
    """What its update holds fixed besides the batch (its `reference` argument): the KL reference, and for
    DiffusionNFT and AWM the moving average too."""

  def rollout_trainable(self, state):
    """The trained state its rollouts sample with: its parameters, or (DiffusionNFT) their moving average."""

  def trained_steps(self, config) -> int:
    """(DiT policies) Denoising steps its update trains per image, for the compile report's FLOPs."""

  def anchor_passes(self, config) -> int:
    """(DiT policies) DiT forwards its update adds per trained step beside its own (reference, moving average)."""
