"""What a run's config decides before anything is built, for the run and `--mode=compile` alike: the models' configs
with their runtime fields (`model_configs`), and whether the rollout's rows and each policy's micro-batches split
over the mesh (`check_batch`)."""

from __future__ import annotations

import dataclasses

import jax
from absl import logging

from glmrl.aot import auto
from glmrl.errors import UserError
from glmrl.models import glm_image
from glmrl.policy import registry
from glmrl.sampling.pipeline import check_decode_batch, decode_chunk


def check_batch(config, mesh_shape: tuple[int, int, int]) -> None:
  """The rollout's AR rows and images (and decoder chunks) must split evenly over data x fsdp; micro-batches
  need not.

  The fields' own rules (e.g. group_size >= 2) are `config_checks`', checked before this runs."""
  data, fsdp, _ = mesh_shape
  devices = data * fsdp
  request = registry.rollout_request(config)
  ga = request.grids_per_prompt
  prompts = config.data.prompts_per_step
  rows, images = prompts * ga, prompts * request.images_per_prompt
  if rows % devices:
    what = "prompts_per_step x group_size = {} x {}".format(prompts, ga) if ga > 1 else f"prompts_per_step {prompts}"
    raise UserError(f"the AR sampler's rows {what} = {rows} do not divide over the mesh's data x fsdp = "
                     f"{data} x {fsdp} = {devices} devices")
  for policy in registry.trained(config).values():
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


def model_configs(config, platform: str | None = None) -> glm_image.GlmImageConfigs:
  """The run's model configs with its runtime fields; `platform`: what the programs run on (--mode=compile: "tpu")."""
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
  if config.model.remat and any(p.component == "dit" for p in registry.trained(config).values()):
    # A DiT policy's update differentiates the DiT: without per-block remat one 1024^2 sample's backward keeps
    # every block's activations and attention scores of both CFG branches (--mode=compile on v5p-64: 226 GB of
    # temporaries per chip for one sample per chip).
    configs = dataclasses.replace(configs, dit=dataclasses.replace(configs.dit, remat=True))
  return configs
