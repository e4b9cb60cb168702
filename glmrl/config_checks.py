"""Validation of an experiment config before any work starts.

Unknown keys and wrongly typed overrides are rejected by ml_collections while flags are parsed
(the config is locked). This module checks the rest: every field of `configs/common.py` has a
rule in `RULES` (type, range or choices), unset required values (`config_dict.placeholder`, read as None) are named, and
a few rules that span fields are checked last. Each message names the full key, e.g.
`config.optim.learning_rate=-0.001: must be > 0`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from typing import Any, Callable

import ml_collections

from glmrl import rewards as rewards_lib  # registers the built-in rewards
from glmrl import sharding as sharding_lib
from glmrl.data import benchmarks
from glmrl.errors import UserError
from glmrl.evaluation import report as eval_report
from glmrl.grpo import advantages as grpo_advantages
from glmrl.grpo import flow as grpo_flow
from glmrl.grpo import loss as grpo_loss
from glmrl.grpo import matching as grpo_matching
from glmrl.logging import wandb_run
from glmrl.models import glm_image
from glmrl.models import lora as lora_lib
from glmrl.models.dit import attention as dit_attention
from glmrl.policy import dit_matching
from glmrl.policy import registry as policy_registry
from glmrl.rewards import compose

DTYPES = tuple(glm_image.DTYPES)
POLICIES = ("ar", "decoder", "ar+decoder")
MODES = ("train", "generate", "eval", "compile")


class ConfigError(UserError):
  """A config value is missing or out of range; the message names the key."""


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one field accepts: a type, then an optional predicate described by `why`."""
  kind: type | tuple[type, ...]
  ok: Callable[[Any], bool] = lambda v: True
  why: str = ""

  def check(self, key: str, value: Any) -> None:
    if value is None:
      raise ConfigError(f"{key} is required but has no value (pass --{key}=...)")
    numeric = self.kind in (int, float, (int, float))
    if isinstance(value, bool) and self.kind is not bool or not isinstance(value, self.kind):
      raise ConfigError(f"{key}={value!r}: must be {_type_name(self.kind)}, not {type(value).__name__}")
    if numeric and not math.isfinite(value):
      raise ConfigError(f"{key}={value!r}: must be finite")
    if not self.ok(value):
      raise ConfigError(f"{key}={value!r}: {self.why}")


def _type_name(kind) -> str:
  kinds = kind if isinstance(kind, tuple) else (kind,)
  return " or ".join({int: "an integer", float: "a number", bool: "True or False", str: "a string"}.get(k, k.__name__)
                     for k in kinds)


def choice(*options) -> Rule:
  return Rule(str, lambda v: v in options, f"must be one of {list(options)}")


def integer(low: int, why: str = "") -> Rule:
  return Rule(int, lambda v: v >= low, why or f"must be >= {low}")


def number(ok: Callable[[float], bool], why: str) -> Rule:
  return Rule((int, float), ok, why)


BOOL = Rule(bool)
STRING = Rule(str)
POSITIVE = number(lambda v: v > 0, "must be > 0")
NON_NEGATIVE = number(lambda v: v >= 0, "must be >= 0")
UNIT_OPEN = number(lambda v: 0 <= v < 1, "must be in [0, 1)")
# A PPO clip's lower side: the ratio's lower bound 1 - epsilon stays >= 0 (1: unbounded below, AWM's released value).
CLIP_LOW = number(lambda v: 0 <= v <= 1, "must be in [0, 1] (the ratio's lower bound 1 - epsilon must not be negative)")
MESH_AXIS = Rule(int, lambda v: v == -1 or v >= 1, "must be -1 (the remaining devices) or >= 1")
PIXELS = Rule(int, lambda v: v > 0 and v % 32 == 0, "must be a positive multiple of 32 (one AR token per 32 px)")

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
    "decoder.ema.steps_per_rollout": integer(1),
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
  """{'section.key': value} of every field but the reward list (unset required values read as None)."""
  out = {}
  for key in cfg.keys():
    value = cfg[key]
    if key == "rewards" and prefix in ("", "decoder."):
      continue
    if isinstance(value, ml_collections.ConfigDict):
      out.update(leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _check(ok: bool, key: str, value, why: str) -> None:
  if not ok:
    raise ConfigError(f"{key}={value!r}: {why}")


def _check_rewards(rewards, where: str = "config.rewards", need_kwargs: bool = True) -> None:
  """`need_kwargs`: every kwarg has a value (not --mode=compile, which builds no reward that takes any)."""
  _check(isinstance(rewards, (list, tuple)) and len(rewards) > 0, where, rewards,
         "must be a non-empty list of {'name': ..., 'weight': ...} entries")
  for i, entry in enumerate(rewards):
    key = f"{where}[{i}]"
    entry = entry.to_dict() if hasattr(entry, "to_dict") else entry
    _check(isinstance(entry, dict), key, entry, "must be a mapping with a name and a weight")
    unknown = sorted(set(entry) - set(compose.ENTRY_KEYS))
    _check(not unknown, key, entry, f"unknown key(s) {unknown}; allowed: {list(compose.ENTRY_KEYS)}")
    _check("name" in entry and "weight" in entry, key, entry, "each reward needs a name and a weight")
    _check(entry["name"] in rewards_lib.names(), f"{key}.name", entry["name"],
           f"no such reward; registered: {rewards_lib.names()}")
    weight = entry["weight"]
    _check(not isinstance(weight, bool) and isinstance(weight, (int, float)) and math.isfinite(weight),
           f"{key}.weight", weight, "must be a finite number")
    _check(isinstance(entry.get("normalize", False), bool), f"{key}.normalize", entry.get("normalize"),
           "must be True or False")
    _check(isinstance(entry.get("kwargs") or {}, dict), f"{key}.kwargs", entry.get("kwargs"), "must be a mapping")
    kwargs = entry.get("kwargs") or {}
    for name, value in kwargs.items():
      if value is None and need_kwargs:
        raise ConfigError(f"{key}.kwargs.{name} is required but has no value (pass --{key}.kwargs.{name}=...)")
    problem = rewards_lib.get(entry["name"]).kwargs_problem(kwargs, complete=need_kwargs)
    if problem:
      raise ConfigError(f"{key}.kwargs: {problem}")


def _check_decoder(cfg, values, need_kwargs: bool = True) -> None:
  """The decoder policy's fields that span several (its window within its steps, what it cannot train yet); a key
  its algorithm does not read was refused before (`READ_WHEN`)."""
  _check_rewards(cfg.decoder.get("rewards"), "config.decoder.rewards", need_kwargs)
  algorithm, steps = values["decoder.algorithm"], values["decoder.train_steps"]
  if algorithm == "flow_grpo":
    _check_window(values, steps)
  else:
    _check_draw(values, steps)
  every = values["decoder.ema.every"]
  _check(algorithm != "nft" or every >= 1, "config.decoder.ema.every", every,
         "decoder.algorithm='nft' samples with and contrasts against the moving average (its old policy): set it "
         ">= 1")
  _check(values["decoder.ema_beta"] == 0 or every >= 1, "config.decoder.ema.every", every,
         f"config.decoder.ema_beta={values['decoder.ema_beta']} anchors to the moving average: set it >= 1")
  _check(not values["decoder.dgpo_clip_dsm"] or every >= 1, "config.decoder.ema.every", every,
         "config.decoder.dgpo_clip_dsm clips against the moving average (DGPO's ema_ref): set it >= 1")
  _check(values["data.mode"] == "t2i", "config.data.mode", values["data.mode"],
         f"the decoder policy (config.train.policies={values['train.policies']!r}) trains text-to-image only: its "
         "update does not read the condition images' DiT cache yet")


def _check_window(values, steps: int) -> None:
  """flow_grpo's SDE window within its denoising steps, and what its log-prob needs."""
  size, start = values["decoder.window_size"], values["decoder.window_start"]
  _check(size <= steps, "config.decoder.window_size", size,
         f"must be <= config.decoder.train_steps={steps} (the SDE window lies within the denoising steps)")
  _check(start <= steps - size, "config.decoder.window_start", start,
         f"must be -1 or in [0, {steps - size}] (train_steps - window_size): the window ends within the steps")
  if start == -1:
    lo, hi = tuple(values["decoder.window_range"])
    _check(lo + size <= steps - 1, "config.decoder.window_range", (lo, hi),
           f"a random window (window_start=-1) of window_size={size} from step {lo} would hold the final step of "
           f"train_steps={steps}; a random window never does (pass --config.decoder.window_start=0 to train "
           "every step)")
    _check(hi == 0 or lo + size <= hi <= steps - 1, "config.decoder.window_range", (lo, hi),
           f"hi must be 0 (the first half) or in [lo + window_size, train_steps - 1] = [{lo + size}, {steps - 1}]")
  slide = values["decoder.window_slide_every"]
  _check(slide == 0 or start == -1, "config.decoder.window_slide_every", slide,
         f"a sliding window moves its start; config.decoder.window_start={start} fixes it (pass one of them)")
  if values["decoder.logprob"] == "flow_grpo":
    _check(values["decoder.sde_type"] == "cps", "config.decoder.logprob", "flow_grpo",
           "is Flow-GRPO's log-prob of a CPS step: it needs decoder.sde_type='cps'")
    _check(not values["decoder.ratio_norm"], "config.decoder.logprob", "flow_grpo",
           "GRPO-Guard's normalised ratio (decoder.ratio_norm) is derived for the density; use logprob='density'")
  if values["decoder.sde_type"] == "cps":
    _check(size <= steps - 1, "config.decoder.window_size", size,
           f"must be <= config.decoder.train_steps - 1 = {steps - 1} with decoder.sde_type='cps' (its final step "
           "has no noise: the window ends before it)")
    _check(start <= steps - size - 1, "config.decoder.window_start", start,
           f"must be -1 or in [0, {steps - size - 1}] with decoder.sde_type='cps' (its final step has no noise: "
           "the window ends before it)")


def _check_draw(values, steps: int) -> None:
  """How nft, awm and dgpo draw the steps they train, within the rollout's schedule."""
  draw, slots = values["decoder.timestep_draw"], values["decoder.train_timesteps"]
  _check(slots <= steps, "config.decoder.train_timesteps", slots, f"must be <= config.decoder.train_steps={steps} "
         "(distinct steps of the rollout's schedule per image)")
  if draw == "high_noise":
    high = values["decoder.high_noise_steps"]
    _check(1 <= high <= steps, "config.decoder.high_noise_steps", high,
           f"must be in [1, config.decoder.train_steps={steps}] with decoder.timestep_draw='high_noise' (the first "
           "steps it draws from: DGPO's trunc_steps + 1)")
    _check(slots <= high, "config.decoder.train_timesteps", slots,
           f"must be <= config.decoder.high_noise_steps={high} (distinct steps of the first {high})")
  if draw == "stratified":
    top = int(steps * values["decoder.stratified_fraction"])
    _check(1 <= slots <= top - 1, "config.decoder.train_timesteps", slots,
           f"must be in [1, {top - 1}] with decoder.timestep_draw='stratified' (one step per stratum of steps 1 .. "
           f"int(train_steps x stratified_fraction) = {top})")


def check_use_ema(cfg, mode: str) -> None:
  """--use_ema: generate and eval only, of a run whose decoder keeps a moving average."""
  _check(mode in ("generate", "eval"), "--use_ema", True,
         f"--mode={mode} takes no --use_ema (it samples with the moving average in --mode=generate and eval)")
  policies, every = cfg.train.policies, cfg.decoder.ema.every
  _check("decoder" in policies and every >= 1, "--use_ema", True,
         f"the run keeps no moving average (config.train.policies={policies!r}, config.decoder.ema.every={every})")


def _check_file(key: str, path: str) -> None:
  _check(not os.path.isdir(path), key, path, "is a folder: name the file of prompts in it")
  _check(os.path.isfile(path), key, path, "no such file")


# Settings read only under a condition: (keys, the setting(s) that decide, is it read given that setting's value
# (their values' tuple where several decide), what reads them). A key set away from its default (configs/common.py)
# where nothing reads it is refused in one line naming what would: a setting that does nothing is a mistake the run
# would never show. One rule for every section (docs/training.md); the first row that refuses a key names it.
_FLOW_GRPO_ONLY = ("decoder.window_size", "decoder.window_range", "decoder.window_start", "decoder.window_slide_every",
                   "decoder.window_slide_stride", "decoder.window_slide_roll_back", "decoder.ratio_norm",
                   "decoder.sde_type", "decoder.noise_level", "decoder.logprob")
# What nft, awm and dgpo read and flow_grpo does not: how they draw the steps they train (flow_grpo trains its
# rollout's own steps, decoder.window_*), the loss's own guidance, the velocity anchor to the moving average.
_MATCHING_ONLY = ("decoder.train_timesteps", "decoder.timestep_draw", "decoder.timestep_sharing",
                  "decoder.loss_guidance", "decoder.ema_beta")
READ_WHEN = (
    (tuple(k for k in RULES if k.startswith("decoder.")), "train.policies", lambda p: "decoder" in p.split("+"),
     "the decoder policy (train.policies='decoder' or 'ar+decoder')"),
    (_FLOW_GRPO_ONLY, "decoder.algorithm", lambda a: a == "flow_grpo", "decoder.algorithm='flow_grpo'"),
    (_MATCHING_ONLY, "decoder.algorithm", lambda a: a != "flow_grpo", "decoder.algorithm 'nft', 'awm' or 'dgpo'"),
    (("decoder.clip_range",), ("decoder.algorithm", "decoder.dgpo_clip_dsm"),
     lambda v: v[0] in ("flow_grpo", "awm") or (v[0] == "dgpo" and v[1]),
     "decoder.algorithm 'flow_grpo' or 'awm', or 'dgpo' with decoder.dgpo_clip_dsm=True"),
    (("decoder.nft_beta",), "decoder.algorithm", lambda a: a == "nft", "decoder.algorithm='nft'"),
    (("decoder.dgpo_beta", "decoder.dgpo_clip_dsm"), "decoder.algorithm", lambda a: a == "dgpo",
     "decoder.algorithm='dgpo'"),
    (("decoder.awm_weighting", "decoder.advantage_max"), "decoder.algorithm", lambda a: a == "awm",
     "decoder.algorithm='awm'"),
    (("decoder.awm_ghuber_power",), "decoder.awm_weighting", lambda w: w == "ghuber",
     "decoder.awm_weighting='ghuber'"),
    (("decoder.high_noise_steps",), "decoder.timestep_draw", lambda d: d == "high_noise",
     "decoder.timestep_draw='high_noise'"),
    (("decoder.stratified_fraction",), "decoder.timestep_draw", lambda d: d == "stratified",
     "decoder.timestep_draw='stratified'"),
    (("decoder.ema.decay", "decoder.ema.flat", "decoder.ema.ramp", "decoder.ema.steps_per_rollout"),
     "decoder.ema.every", lambda every: every >= 1, "a moving average (decoder.ema.every >= 1)"),
    (("grpo.tis_mode",), "grpo.tis_cap", lambda cap: cap > 0, "truncated importance sampling (grpo.tis_cap > 0)"),
    (("log.wandb_project", "log.wandb_name", "log.wandb_mode"), "log.wandb", bool, "W&B logging (log.wandb=True)"),
    (("eval.drift_lpips_dir",), "--mode", lambda mode: mode == "eval", "--mode=eval"),
)


def _differs(value, default) -> bool:
  """Whether `value` is set away from `default` (an int and a float of one number are one setting)."""
  numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, default))
  if numbers:
    return float(value) != float(default)
  if isinstance(value, (tuple, list)) and isinstance(default, (tuple, list)):
    return tuple(value) != tuple(default)  # a run's config.json holds lists where the defaults hold tuples
  return value != default


def _shown(decider, setting, mode: str) -> str:
  if decider == "--mode":
    return f"--mode={mode}"
  if isinstance(decider, tuple):
    return ", ".join(f"config.{k}={v!r}" for k, v in zip(decider, setting))
  return f"config.{decider}={setting!r}"


def _check_read(values: dict, mode: str) -> None:
  from configs import common  # pylint: disable=import-outside-toplevel  (the defaults)

  defaults = leaves(common.base_config())
  for keys, decider, is_read, reader in READ_WHEN:
    if decider == "--mode":
      setting = mode
    else:
      setting = tuple(values[k] for k in decider) if isinstance(decider, tuple) else values[decider]
    if is_read(setting):
      continue
    for key in keys:
      if _differs(values[key], defaults[key]):
        raise ConfigError(f"config.{key}={values[key]!r} does nothing in this run ({_shown(decider, setting, mode)}): "
                          f"only {reader} reads it; leave it at its default {defaults[key]!r}")


def _check_lpips_folder(folder: str) -> None:
  """What `python -m checkpoints_convert.lpips` writes: config.json of LPIPS-VGG16 and params/ (before any model)."""
  key, convert = "config.eval.drift_lpips_dir", "convert LPIPS: python -m checkpoints_convert.lpips"
  _check(os.path.isdir(folder), key, folder, f"no such directory ({convert})")
  config_path = os.path.join(folder, "config.json")
  _check(os.path.isfile(config_path) and os.path.isdir(os.path.join(folder, "params")), key, folder,
         f"not a converted LPIPS folder: it needs config.json and params/ ({convert})")
  from glmrl.models.lpips import LPIPSConfig  # pylint: disable=import-outside-toplevel

  try:
    with open(config_path, encoding="utf-8") as f:
      LPIPSConfig.from_hf(json.load(f))
  except (ValueError, TypeError, AttributeError) as e:
    _check(False, key, folder, f"{config_path} is not an LPIPS config ({e}; {convert})")


def validate(cfg: ml_collections.ConfigDict, mode: str = "train") -> None:
  """Raises ConfigError naming the first missing or invalid value (`mode`: what main.py will run)."""
  values = leaves(cfg)
  unchecked = sorted(set(values) - set(RULES))
  if unchecked:
    # A key the defaults lack: a config file set a misspelt name (or a new field lacks its rule here).
    close = difflib.get_close_matches(unchecked[0], list(RULES), n=1, cutoff=0.75)
    raise ConfigError(f"config.{unchecked[0]} is not a config key"
                      + (f" (did you mean config.{close[0]}?)" if close else " (all keys: configs/common.py)"))
  missing = [key for key in RULES if key not in values]
  if missing:
    # A config file written before the key existed, e.g. an older run's <workdir>/config.py after an upgrade.
    raise ConfigError(f"config.{missing[0]} is missing (and {len(missing) - 1} more key(s)): the config file predates "
                      "it; add it with the default configs/common.py gives it")
  _check(mode in MODES, "--mode", mode, f"must be one of {list(MODES)}")
  # Compiling needs shapes only: no prompts are read and no weights (without a checkpoint: the preset's).
  unread = ("data.prompts_file", "model.checkpoint_dir") if mode == "compile" else ()
  for key, rule in RULES.items():
    if key in values and not (key in unread and values[key] is None):
      rule.check(f"config.{key}", values[key])
  _check_rewards(cfg.get("rewards"), need_kwargs=mode != "compile")
  _check_read(values, mode)

  _check(not values["grpo.kl_bias_correction"] or values["grpo.beta"] > 0, "config.grpo.kl_bias_correction", True,
         "corrects the KL term, which config.grpo.beta=0 leaves out: set grpo.beta > 0, or leave it False")
  if "decoder" in values["train.policies"]:
    _check_decoder(cfg, values, need_kwargs=mode != "compile")

  mesh = {a: values[f"mesh.{a}"] for a in ("data", "fsdp", "tensor")}
  _check(list(mesh.values()).count(-1) <= 1, "config.mesh", mesh, "at most one axis may be -1")
  if mode == "compile":
    _check(bool(values["compile.topology"]), "config.compile.topology", values["compile.topology"],
           "--mode=compile needs a target slice, e.g. --config.compile.topology=v5p-64 or h100-8")
    from glmrl.programs import topology  # pylint: disable=import-outside-toplevel  # names only, no backend
    platform = topology.parse(values["compile.topology"]).chip.platform
    where = f"--config.compile.topology={values['compile.topology']} is a {platform.upper()} target"
  else:
    import jax  # pylint: disable=import-outside-toplevel
    platform = jax.default_backend()
    where = f"this run's backend is {platform!r}"
  if values["model.dit_attention"] == "cudnn":
    _check(platform == "gpu", "config.model.dit_attention", "cudnn",
           f"cuDNN flash attention needs NVIDIA GPUs; {where} (use 'xla' or 'auto')")
    _check(values["model.compute_dtype"] in ("bfloat16", "float16"), "config.model.dit_attention", "cudnn",
           f"cuDNN flash attention takes 16-bit operands; config.model.compute_dtype={values['model.compute_dtype']!r} "
           "(use bfloat16, or 'auto', which picks XLA's kernel for float32)")
  if values["model.dit_attention"] == "splash":
    _check(platform == "tpu", "config.model.dit_attention", "splash",
           f"Pallas splash attention is TPU's kernel; {where} (use 'blocked', 'xla' or 'auto')")
  if mode == "compile":
    _check(not values["model.checkpoint_dir"] or os.path.isdir(values["model.checkpoint_dir"]),
           "config.model.checkpoint_dir", values["model.checkpoint_dir"], "no such directory")
    return
  ckpt = values["model.checkpoint_dir"]
  _check(not ckpt or os.path.isdir(ckpt), "config.model.checkpoint_dir", ckpt,
         "no such directory (convert the HF folder first: python -m checkpoints_convert --hf_dir=... --out_dir=...)")
  _check_file("config.data.prompts_file", values["data.prompts_file"])
  _check(not (values["eval.prompts_file"] and values["eval.benchmark"]), "config.eval.benchmark",
         values["eval.benchmark"], f"and config.eval.prompts_file={values['eval.prompts_file']!r} both name held-out "
         "prompts: set one")
  if mode == "eval" or values["eval.interval"]:
    why = ("--mode=eval" if mode == "eval" else f"config.eval.interval={values['eval.interval']}")
    _check(bool(values["eval.prompts_file"] or values["eval.benchmark"]), "config.eval.prompts_file",
           values["eval.prompts_file"], f"{why} needs held-out prompts: pass --config.eval.prompts_file=... or "
           "--config.eval.benchmark=NAME")
  _check(mode == "eval" or not values["eval.steps"], "config.eval.steps", values["eval.steps"],
         "compares checkpoints in --mode=eval only")
  if values["eval.prompts_file"] and (mode == "eval" or values["eval.interval"]):
    _check_file("config.eval.prompts_file", values["eval.prompts_file"])
  if values["eval.drift_lpips_dir"] and mode == "eval":
    _check_lpips_folder(values["eval.drift_lpips_dir"])
  if values["log.wandb"]:
    import importlib.util
    _check(importlib.util.find_spec("wandb") is not None, "config.log.wandb", True,
           "needs the wandb package: pip install -r requirements-wandb.txt")
