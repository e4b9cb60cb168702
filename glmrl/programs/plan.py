"""What a run derives from its config before it builds anything, made in one call (`make`) and handed down as one
frozen `RunPlan`: the config with every `auto` resolved, the models' configs with their runtime fields, the trained
policies bound once to that config and the rollout they share, and what each `auto` became. The run's setup
(`glmrl.train.setup`) and `--mode=compile`'s abstract run (`glmrl.programs.abstract`) ask for it the same way.
`make`'s steps are its own: `draft` (no device sizes needed), the batch split checked against the mesh
(`check_batch`), then every `auto` chosen for the devices' memory (`glmrl.programs.auto`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from absl import logging

from glmrl.errors import UserError
from glmrl.models import glm_image
from glmrl.policy import registry
from glmrl.policy.base import Request
from glmrl.programs import auto
from glmrl.sampling.pipeline import check_decode_batch, decode_chunk


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """See the module docstring. `config` is the plan's own copy (`draft`): what the user's object becomes later
  changes no plan; `make` writes each `auto` choice into it, where the policies bound to it read it."""
  config: Any
  platform: str  # what the programs run on ("tpu" for --mode=compile's slices)
  configs: glm_image.GlmImageConfigs
  policies: dict  # policy name -> `glmrl.policy.base.Policy`, bound to `config`
  request: Request  # the rollout the trained policies share
  choices: tuple = ()  # what each `auto` setting became (`glmrl.programs.auto.Choice`)


class PlanView:
  """What a built run reads of its `plan` (`glmrl.train.setup.Run`, `glmrl.programs.abstract.AbstractRun`)."""
  plan: RunPlan

  @property
  def config(self):
    """The run's config, every `auto` resolved."""
    return self.plan.config

  @property
  def configs(self) -> glm_image.GlmImageConfigs:
    return self.plan.configs

  @property
  def policies(self) -> dict:
    """The trained policies by name, bound to the run's config (`glmrl.policy.registry`)."""
    return self.plan.policies

  @property
  def request(self) -> Request:
    """The rollout every trained policy shares: token grids per prompt, decoder samples per grid."""
    return self.plan.request

  @property
  def choices(self) -> tuple:
    """What each `auto` setting became (`glmrl.programs.auto.Choice`)."""
    return self.plan.choices


def make(config, mesh, hbm_bytes: int, abstract_run: Callable[[RunPlan], Any], platform: str | None = None
         ) -> RunPlan:
  """The plan of `config` on `mesh` of `platform` chips (default: this process's backend) of `hbm_bytes` each: the
  draft, its batch split checked against the mesh, then every `auto` chosen (`glmrl.programs.auto`) and written
  into the plan's config, which the policies were bound to once. `abstract_run(draft)`: the draft's abstract run
  (`glmrl.programs.abstract.AbstractRun`), built only when a choice depends on the run's sizes."""
  plan = draft(config, platform)
  check_batch(plan, tuple(mesh.shape[axis] for axis in ("data", "fsdp", "tensor")))
  choices = auto.choose(plan, mesh, hbm_bytes, abstract_run)
  # The models' configs hold the platform's attention kernel already (`model_configs`), and the sampler's weight
  # layout is not theirs: only the config changes.
  with plan.config.unlocked():
    for choice in choices:
      section, key = choice.key.split(".")
      plan.config[section][key] = choice.value
  return dataclasses.replace(plan, choices=choices)


def draft(config, platform: str | None = None) -> RunPlan:
  """`make`'s first step: the plan of `config` on `platform` (default: this process's backend) before `auto` is
  resolved for the devices' memory, its policies bound to its own copy of `config`."""
  platform = platform or jax.default_backend()
  config = config.copy_and_resolve_references()
  policies = registry.trained(config)
  return RunPlan(config, platform, model_configs(config, platform, policies), policies,
                 registry.shared_request(policies))


def check_batch(plan: RunPlan, mesh_shape: tuple[int, int, int]) -> None:
  """The rollout's AR rows and images (and decoder chunks) must split evenly over data x fsdp; micro-batches
  need not.

  The fields' own rules (e.g. group_size >= 2) are `glmrl.config`'s, checked before this runs."""
  config, request = plan.config, plan.request
  data, fsdp, _ = mesh_shape
  devices = data * fsdp
  ga = request.grids_per_prompt
  prompts = config.data.prompts_per_step
  rows, images = prompts * ga, prompts * request.images_per_prompt
  if rows % devices:
    what = "prompts_per_step x group_size = {} x {}".format(prompts, ga) if ga > 1 else f"prompts_per_step {prompts}"
    raise UserError(f"the AR sampler's rows {what} = {rows} do not divide over the mesh's data x fsdp = "
                     f"{data} x {fsdp} = {devices} devices")
  for policy in plan.policies.values():
    batch = prompts * policy.rows_per_prompt(request)
    micro = policy.settings.micro_batch_size or batch
    if batch % micro:
      raise UserError(f"{policy.micro_batch_key}={micro} does not divide its update's batch {batch}")
    if micro % devices:
      # Correct (XLA splits what it can and replicates the rest) but slower: e.g. micro-batches of 16 on a
      # 32-chip slice. Allowed, since the batch layout is the user's trade between memory and speed.
      logging.warning("%s=%d does not split evenly over data x fsdp = %d devices: each micro-batch is partly "
                      "replicated", policy.micro_batch_key, micro, devices)
  chunk = config.sampling.decode_batch
  if chunk > 0:  # 0 picks a chunk that fits every batch (`decode_chunk`); -1 decodes each whole
    # The rollout's images, and evaluation's and generation's group_size samples of every prompt.
    check_decode_batch(chunk, images, request.images_per_prompt)
    check_decode_batch(chunk, prompts * config.grpo.group_size, config.grpo.group_size)
    if chunk % devices:
      raise UserError(f"config.sampling.decode_batch={chunk} does not split over data x fsdp = {devices}")
  elif chunk == 0:
    logging.info("decoder calls of %d samples (sampling.decode_batch=0: one sample per data x fsdp device)",
                 decode_chunk(0, images, request.images_per_prompt, devices))


def dit_attention(config, platform: str | None = None) -> str:
  """config.model.dit_attention, "auto" resolved for `platform` (default: this process's backend)."""
  choice = auto.dit_attention(config, platform or jax.default_backend())  # the rule's one home
  return config.model.dit_attention if choice is None else choice.value


def model_configs(config, platform: str | None = None, policies: dict | None = None) -> glm_image.GlmImageConfigs:
  """The run's model configs with its runtime fields; `platform`: what the programs run on (--mode=compile: "tpu");
  `policies`: the trained ones (default: the config's, bound here; a plan passes its own)."""
  if config.model.checkpoint_dir:
    configs = glm_image.checkpoint_configs(config.model.checkpoint_dir)
  else:
    configs = glm_image.preset_configs(config.model.preset)
  configs.check_consistent()
  attention = dit_attention(config, platform)
  configs = glm_image.with_dtypes(configs, param_dtype=glm_image.DTYPES[config.model.param_dtype],
                                  compute_dtype=glm_image.DTYPES[config.model.compute_dtype],
                                  remat=config.model.remat,
                                  dit_attention=None if attention == "xla" else attention,
                                  dit_cfg_batched=config.model.dit_cfg_batched)
  policies = registry.trained(config) if policies is None else policies
  if config.model.remat and any(p.component == "dit" for p in policies.values()):
    # A DiT policy's update differentiates the DiT: without per-block remat one 1024^2 sample's backward keeps
    # every block's activations and attention scores of both CFG branches (--mode=compile on v5p-64: 226 GB of
    # temporaries per chip for one sample per chip).
    configs = dataclasses.replace(configs, dit=dataclasses.replace(configs.dit, remat=True))
  return configs
