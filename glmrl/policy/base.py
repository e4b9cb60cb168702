"""What a trained policy is to the run: its settings under one name each, the rollout it asks for, where its
state is saved, and the small interface the Trainer, the rollout, checkpoints, evaluation, `--mode=compile` and
the export call.

A policy is bound once to the run's config (`registry.trained`): its settings are read then, and its methods
never take the config again. A policy module (`ar.py`, `flow_grpo.py`, `nft.py`, `awm.py`) holds its rollout
batch and that batch's abstract shapes, its loss, its update and its FLOPs; a DiT policy also its rollout leg
(the decode its update trains on). A new policy is one more such module, listed in `registry.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from glmrl.models import lora as lora_lib
from glmrl.policy.ema import EmaSettings


@dataclasses.dataclass(frozen=True)
class Settings:
  """A policy's settings, read from its config section once (when the policy is bound)."""
  lora: lora_lib.LoraConfig
  optim: Any               # the config section of its optimizer (`optimizer.make_optimizer`)
  num_iterations: int      # updates per rollout
  beta: float              # KL weight (> 0: a reference policy is kept)
  micro_batch_size: int    # rows per micro-batch of its update (0: the whole batch)
  ema: EmaSettings = EmaSettings()  # the moving average of its trained parameters (off by default)
  advantage_scale: str = "group"    # what divides its advantages: the group's reward std, the batch's, or none

  @property
  def reference(self) -> str:
    """Its KL reference: "params" (a copy of the initial trained state) or "adapters_off" (LoRA: its adapters
    switched off, the base itself)."""
    return "adapters_off" if self.lora.enabled else "params"

  def micro_batches(self, rows: int) -> int:
    """Micro-batches of its update on `rows` rows."""
    return rows // (self.micro_batch_size or rows)


def lora_settings(section) -> lora_lib.LoraConfig:
  """A LoRA config section's settings; alpha unset (0) is the rank (scale alpha / rank = 1)."""
  return lora_lib.LoraConfig(rank=section.rank, alpha=float(section.alpha) or float(section.rank),
                             targets=lora_lib.target_patterns(section.targets))


@dataclasses.dataclass(frozen=True)
class Saved:
  """Where a policy's state lives in a run's folder, and what the export reads of it."""
  params: str              # step item of its trained parameters (the whole model's, or its LoRA adapters)
  opt_state: str           # step item of its optimizer state
  ema: str | None          # step item of its moving average (saved when its settings keep one; None: never)
  adapters_file: str       # record of its LoRA adapters and their base (`checkpoint.adapters.check_adapters`)
  model_config_file: str   # record of the trained model's HF config (the export writes the model with it)
  lora_section: str        # its LoRA settings' config path, for messages
  role: str                # what the trained model is, in messages ("generator", "decoder")
  export_component: str    # the pipeline folder's component the export writes it as


@dataclasses.dataclass(frozen=True)
class Request:
  """The rollout a policy asks for: token grids per prompt and decoder samples per grid."""
  grids_per_prompt: int = 1
  samples_per_grid: int = 1

  @property
  def images_per_prompt(self) -> int:
    return self.grids_per_prompt * self.samples_per_grid

  def __or__(self, other: "Request") -> "Request":
    """One rollout serving both requests (each policy asks for its own axis)."""
    return Request(max(self.grids_per_prompt, other.grids_per_prompt),
                   max(self.samples_per_grid, other.samples_per_grid))


@dataclasses.dataclass(frozen=True)
class FlopCounts:
  """What a policy's FLOPs are counted from (`glmrl.programs.report.step_flops`): one forward of the generator over
  the rollout's rows, one DiT pass (one image, one step, one CFG branch), the rollout's images."""
  ar_forward: float
  dit_pass: float
  images: int


class BoundPolicy:
  """What every policy shares once bound (`registry.trained`): the config it was bound to, and the interface's
  defaults (no rollout leg of its own, the KL reference as its update's anchor, its parameters as the sampler's)."""
  decodes = False
  contrasts_reference = False  # its loss reads the reference policy whatever its KL weight

  def __init__(self, config):
    self.config = config

  def anchors(self, state):
    return state.reference

  def rollout_trainable(self, state):
    return state.trainable


class Policy(Protocol):
  """One trained policy, bound to the run's config (see the module docstring)."""
  name: str            # "ar" | "decoder": config.train.policies' word, the key of the run's states
  component: str       # the pipeline model it trains ("ar" | "dit")
  saved: Saved         # its checkpoint items and records
  salt: int            # separates its adapters' initial A from other models' drawn from one seed
  full_filter: Any     # what full fine-tuning trains of its model (nnx filter)
  micro_batch_key: str  # its micro-batch size's config path, for messages
  programs: tuple[str, str]  # its rewards' and its update's program names in the compile report
  rewards_key: str     # the config key of its reward entries
  settings: Settings
  request: Request     # the rollout it asks for
  decodes: bool        # it decodes the rollout's images itself (`rollout_leg`): a DiT policy
  contrasts_reference: bool  # its loss reads the reference policy whatever its KL weight (DGPO)

  def rows_per_prompt(self, request: Request) -> int:
    """Rows of its update's batch per prompt of the rollout."""

  def rewards(self, request: Request) -> tuple:
    """(its reward entries, rows a per-group reward normalisation spans)."""

  def prefix(self, policies: tuple[str, ...]) -> str:
    """Its metrics' prefix among the run's `policies`."""

  def group_rewards(self, total_B, request: Request):
    """(rewards of its rows, rows per group) from the images' total rewards [B]."""

  def rollout_leg(self, run, prepared, sample, key, dit_params, step: int, on_images=None) -> tuple:
    """(A DiT policy) (images, its part of the rollout, metrics): the rollout's decode as its update needs it
    (`on_images`: `Pipeline.decode_tokens`'s)."""

  def rollout_batch(self, sampled, advantages, keep):
    """Its update's inputs from the rollout (`rollout.Sampled`), learner log-probs NaN until the first update."""

  def abstract_inputs(self, run) -> tuple:
    """(update shape, batch) of its update as ShapeDtypeStructs with the run's shardings (`--mode=compile`;
    `run`: `glmrl.programs.abstract.AbstractRun`)."""

  def update_shape(self, sampled) -> tuple:
    """What its compiled update depends on besides its settings (static)."""

  def make_update(self, state, shape):
    """Its update jitted once: fn(trainable, frozen, opt_state, batch, anchors, first)."""

  def after_first(self, batch, outputs) -> tuple[Any, dict]:
    """(batch with the first update's learner log-probs, diagnostics of them) for the later iterations."""

  def anchors(self, state):
    """What its update holds fixed besides the batch: the KL reference, and for DiffusionNFT and AWM the moving
    average too."""

  def rollout_trainable(self, state):
    """The trained state its rollouts sample with: its parameters, or (DiffusionNFT) their moving average."""

  def update_flops(self, counts: FlopCounts) -> float:
    """FLOPs of its updates in one training step (all iterations)."""
