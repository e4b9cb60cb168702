"""One rule per key of configs/common.py (`RULES`; a test keeps the two in step), and a config's keys and values
(`leaves`)."""

from __future__ import annotations

from typing import Any

import ml_collections

from glmrl import sharding as sharding_lib
from glmrl.config.choices import DTYPES, POLICIES, REWARD_LISTS
from glmrl.config.rules import (BOOL, CLIP_LOW, MESH_AXIS, NON_NEGATIVE, PIXELS, POSITIVE, STRING, UNIT_OPEN, Rule,
                                choice, integer, number)
from glmrl.data import benchmarks
from glmrl.errors import UserError
from glmrl.evaluation import report as eval_report
from glmrl.grpo import advantages as grpo_advantages
from glmrl.grpo import flow as grpo_flow
from glmrl.grpo import loss as grpo_loss
from glmrl.grpo import matching as grpo_matching
from glmrl.logging import wandb_run
from glmrl.models import lora as lora_lib
from glmrl.models.dit import attention as dit_attention
from glmrl.policy import dit_matching
from glmrl.policy import ema as ema_lib
from glmrl.policy import registry as policy_registry


def _lora_targets_ok(value: str) -> bool:
  try:
    lora_lib.target_patterns(value)
  except ValueError:
    return False
  return True


def _benchmark_ok(value: str) -> bool:
  if not value:
    return True
  try:
    benchmarks.parse(value)
  except UserError:
    return False
  return True


def _steps_ok(value: str) -> bool:
  try:
    eval_report.parse_steps(value)
  except UserError:
    return False
  return True


# One rule per field of configs/common.py (a test keeps the two in step).
RULES: dict[str, Rule] = {
    "seed": integer(0),
    "model.checkpoint_dir": STRING,
    "model.preset": choice("tiny", "full"),
    "model.param_dtype": choice(*DTYPES),
    "model.compute_dtype": choice(*DTYPES),
    "model.remat": BOOL,
    "model.dit_cfg_batched": BOOL,
    "model.dit_attention": choice("auto", *dit_attention.IMPLS),
    "lora.rank": integer(0, why="must be >= 0 (0: full fine-tuning)"),
    "lora.alpha": NON_NEGATIVE,
    "lora.targets": Rule(str, _lora_targets_ok, f"must be a preset {sorted(lora_lib.TARGET_PRESETS)} or a valid regex"),
    "data.prompts_file": Rule(str, bool, "must name a .txt or .jsonl prompts file"),
    "data.mode": choice("t2i", "i2i"),
    "data.height": PIXELS,
    "data.width": PIXELS,
    "data.max_prompt_tokens": integer(1),
    "data.max_glyph_tokens": integer(1),
    "data.max_glyph_texts": integer(1),
    "data.prompts_per_step": integer(1),
    "sampling.temperature": POSITIVE,
    "sampling.top_p": number(lambda v: 0 < v <= 1, "must be in (0, 1] (1 disables nucleus sampling)"),
    "sampling.top_k": integer(0, why="must be >= 0 (0 disables top-k)"),
    "sampling.constrain_to_codebook": BOOL,
    "sampling.dit_steps": integer(1),
    "sampling.guidance_scale": NON_NEGATIVE,
    "sampling.share_noise_in_group": BOOL,
    "sampling.decode_batch": integer(-1, why="must be >= -1 (0 picks one sample per data x fsdp device, -1 decodes each batch whole)"),
    "grpo.group_size": integer(2, why="must be at least 2 (advantages are relative to the group)"),
    "grpo.num_iterations": integer(1),
    "grpo.epsilon_low": CLIP_LOW,
    "grpo.epsilon_high": NON_NEGATIVE,
    "grpo.beta": NON_NEGATIVE,
    "grpo.kl": choice(*grpo_loss.KL_ESTIMATORS),
    "grpo.aggregation": choice(*grpo_loss.AGGREGATIONS),
    "grpo.scale": choice(*grpo_advantages.SCALES),
    "grpo.estimator": choice(*grpo_advantages.ESTIMATORS),
    "grpo.drop_zero_variance_groups": BOOL,
    "grpo.loss_tokens": choice("all", "target"),
    "grpo.std_eps": UNIT_OPEN,
    "grpo.tis_cap": number(lambda v: v == 0 or v >= 1, "must be 0 (off) or >= 1"),
    "grpo.tis_mode": choice(*grpo_loss.TIS_MODES),
    "grpo.dual_clip": number(lambda v: v == 0 or v > 1, "must be 0 (off) or > 1"),
    "grpo.ratio_level": choice(*grpo_loss.RATIO_LEVELS),
    "grpo.kl_bias_correction": BOOL,
    "optim.learning_rate": POSITIVE,
    "optim.warmup_steps": integer(0),
    "optim.weight_decay": NON_NEGATIVE,
    "optim.b1": UNIT_OPEN,
    "optim.b2": UNIT_OPEN,
    "optim.eps": POSITIVE,
    "optim.max_grad_norm": POSITIVE,
    "decoder.optim.learning_rate": POSITIVE,
    "decoder.optim.warmup_steps": integer(0),
    "decoder.optim.weight_decay": NON_NEGATIVE,
    "decoder.optim.b1": UNIT_OPEN,
    "decoder.optim.b2": UNIT_OPEN,
    "decoder.optim.eps": POSITIVE,
    "decoder.optim.max_grad_norm": POSITIVE,
    "train.num_steps": integer(1),
    "train.micro_batch_size": integer(0, why="must be >= 0 (0 uses the whole batch at once)"),
    "train.max_consecutive_nonfinite": integer(1),
    "train.policies": choice(*POLICIES),
    "decoder.algorithm": choice(*policy_registry.DIT_ALGORITHMS),
    "decoder.recipe": STRING,  # its names: configs/released.py's (`glmrl.config.recipes`)
    "decoder.train_guidance": NON_NEGATIVE,
    "decoder.loss_guidance": NON_NEGATIVE,
    "decoder.dgpo_clip_dsm": BOOL,
    "decoder.sde_type": choice(*grpo_flow.SDE_TYPES),
    "decoder.logprob": choice(*grpo_flow.LOGPROBS),
    "decoder.train_timesteps": integer(0, why="must be >= 0 (0: every step of decoder.train_steps)"),
    "decoder.timestep_draw": choice(*dit_matching.TIMESTEP_DRAWS),
    "decoder.high_noise_steps": integer(0),
    "decoder.stratified_fraction": number(lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "decoder.timestep_sharing": choice(*dit_matching.TIMESTEP_SHARING),
    "decoder.nft_beta": number(lambda v: 0 < v <= 1, "must be in (0, 1] (DiffusionNFT's b)"),
    "decoder.awm_weighting": choice(*grpo_matching.AWM_WEIGHTINGS),
    "decoder.awm_ghuber_power": number(lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "decoder.advantage_max": NON_NEGATIVE,
    "decoder.dgpo_beta": POSITIVE,
    "decoder.ema_beta": NON_NEGATIVE,
    "decoder.ema.decay": UNIT_OPEN,
    "decoder.ema.every": integer(0, why="must be >= 0 (0 keeps no moving average)"),
    "decoder.ema.ramp": NON_NEGATIVE,
    "decoder.ema.flat": integer(0),
    "decoder.ema.after": choice(*ema_lib.AFTER),
    "decoder.group_size": integer(2, why="must be at least 2 (advantages are relative to the group)"),
    "decoder.noise_level": POSITIVE,
    "decoder.train_steps": integer(1),
    "decoder.window_size": integer(1),
    # A list when read back from a run's config.py (JSON has no tuples).
    "decoder.window_range": Rule((tuple, list), lambda v: len(v) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v),
        "must be (lo, hi): two integers >= 0 (hi 0: the first half of the steps)"),
    "decoder.window_start": Rule(int, lambda v: v >= -1, "must be -1 (random per rollout) or a step index >= 0"),
    "rollout.ar_weights": choice("auto", *sharding_lib.ROLLOUT_WEIGHTS),
    "rollout.overlap_rewards": BOOL,
    "decoder.window_slide_every": integer(0, why="must be >= 0 (0: a random window per rollout)"),
    "decoder.window_slide_stride": integer(0, why="must be >= 0 (0: window_size)"),
    "decoder.window_slide_roll_back": BOOL,
    "decoder.ratio_norm": BOOL,
    "decoder.clip_range": number(lambda v: 0 < v <= 1, "must be in (0, 1] (the ratio's lower bound 1 - clip_range "
                                 "must not be negative; 1: AWM's released value)"),
    "decoder.adv_std": choice("group", "batch"),
    "decoder.adv_clip_max": POSITIVE,
    "decoder.beta": NON_NEGATIVE,
    "decoder.num_iterations": integer(1),
    "decoder.micro_batch_size": integer(0, why="must be >= 0 (0 uses the whole batch at once)"),
    "decoder.lora.rank": integer(0, why="must be >= 0 (0: full DiT fine-tuning)"),
    "decoder.lora.alpha": NON_NEGATIVE,
    "decoder.lora.targets": Rule(str, _lora_targets_ok,
                                 f"must be a preset {sorted(lora_lib.TARGET_PRESETS)} or a valid regex"),
    "normalize_rewards_per_group": BOOL,
    "mesh.data": MESH_AXIS,
    "mesh.fsdp": MESH_AXIS,
    "mesh.tensor": MESH_AXIS,
    "checkpoint.save_interval": integer(1),
    "checkpoint.max_to_keep": integer(1),
    "log.image_interval": integer(0, why="must be >= 0 (0 disables sample grids)"),
    "log.wandb": BOOL,
    "log.wandb_project": STRING,
    "log.wandb_name": STRING,
    "log.wandb_mode": choice(*wandb_run.MODES),
    "eval.interval": integer(0, why="must be >= 0 (0 disables periodic evaluation)"),
    "compile.topology": STRING,
    "compile.programs": STRING,
    "eval.prompts_file": STRING,
    "eval.benchmark": Rule(str, _benchmark_ok, f"must be '' or a shipped benchmark {list(benchmarks.NAMES)}, "
                           "optionally with ':N' (N >= 1 of its prompts)"),
    "eval.hacking_patience": integer(0, why="must be >= 0 (0: no reward-hacking warning)"),
    "eval.max_prompts": integer(0, why="must be >= 0 (0: every held-out prompt)"),
    "eval.steps": Rule(str, _steps_ok, "must be '' or distinct step numbers >= 0 separated by commas, e.g. 0,500"),
    "eval.seed": integer(0),
    "eval.drift_lpips_dir": STRING,
}


def leaves(cfg: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
  """{'section.key': value} of every field but the reward lists (`REWARD_LISTS`; unset required values read as
  None)."""
  out = {}
  for key in cfg.keys():
    value = cfg[key]
    if f"{prefix}{key}" in REWARD_LISTS:
      continue
    if isinstance(value, ml_collections.ConfigDict):
      out.update(leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out
