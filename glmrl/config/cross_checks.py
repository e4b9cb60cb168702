"""The rules that span several keys: the reward lists' entries, and the decoder policy's window within its steps
and its draw of the steps it trains. A key its algorithm does not read is refused before these run
(`glmrl.config.inert`)."""

from __future__ import annotations

import math

from glmrl import rewards as rewards_lib  # registers the built-in rewards
from glmrl.config.rules import ConfigError, check
from glmrl.rewards import compose


def check_rewards(rewards, where: str = "config.rewards", need_kwargs: bool = True) -> None:
  """`need_kwargs`: every kwarg has a value (not --mode=compile, which builds no reward that takes any)."""
  check(isinstance(rewards, (list, tuple)) and len(rewards) > 0, where, rewards,
         "must be a non-empty list of {'name': ..., 'weight': ...} entries")
  for i, entry in enumerate(rewards):
    key = f"{where}[{i}]"
    entry = entry.to_dict() if hasattr(entry, "to_dict") else entry
    check(isinstance(entry, dict), key, entry, "must be a mapping with a name and a weight")
    unknown = sorted(set(entry) - set(compose.ENTRY_KEYS))
    check(not unknown, key, entry, f"unknown key(s) {unknown}; allowed: {list(compose.ENTRY_KEYS)}")
    check("name" in entry and "weight" in entry, key, entry, "each reward needs a name and a weight")
    check(entry["name"] in rewards_lib.names(), f"{key}.name", entry["name"],
           f"no such reward; registered: {rewards_lib.names()}")
    weight = entry["weight"]
    check(not isinstance(weight, bool) and isinstance(weight, (int, float)) and math.isfinite(weight),
           f"{key}.weight", weight, "must be a finite number")
    check(isinstance(entry.get("normalize", False), bool), f"{key}.normalize", entry.get("normalize"),
           "must be True or False")
    check(isinstance(entry.get("kwargs") or {}, dict), f"{key}.kwargs", entry.get("kwargs"), "must be a mapping")
    kwargs = entry.get("kwargs") or {}
    for name, value in kwargs.items():
      if value is None and need_kwargs:
        raise ConfigError(f"{key}.kwargs.{name} is required but has no value (pass --{key}.kwargs.{name}=...)")
    problem = rewards_lib.get(entry["name"]).kwargs_problem(kwargs, complete=need_kwargs)
    if problem:
      raise ConfigError(f"{key}.kwargs: {problem}")


def check_decoder(cfg, values, need_kwargs: bool = True) -> None:
  """The decoder policy's fields that span several (its window within its steps, what it cannot train yet); a key
  its algorithm does not read was refused before (`READ_WHEN`)."""
  check_rewards(cfg.decoder.get("rewards"), "config.decoder.rewards", need_kwargs)
  algorithm, steps = values["decoder.algorithm"], values["decoder.train_steps"]
  if algorithm == "flow_grpo":
    _window(values, steps)
  else:
    _draw(values, steps)
  every = values["decoder.ema.every"]
  check(algorithm != "nft" or every >= 1, "config.decoder.ema.every", every,
         "decoder.algorithm='nft' samples with and contrasts against the moving average (its old policy): set it "
         ">= 1")
  check(values["decoder.ema_beta"] == 0 or every >= 1, "config.decoder.ema.every", every,
         f"config.decoder.ema_beta={values['decoder.ema_beta']} anchors to the moving average: set it >= 1")
  check(not values["decoder.dgpo_clip_dsm"] or every >= 1, "config.decoder.ema.every", every,
         "config.decoder.dgpo_clip_dsm clips against the moving average (DGPO's ema_ref): set it >= 1")
  check(values["data.mode"] == "t2i", "config.data.mode", values["data.mode"],
         f"the decoder policy (config.train.policies={values['train.policies']!r}) trains text-to-image only: its "
         "update does not read the condition images' DiT cache yet")


def _window(values, steps: int) -> None:
  """flow_grpo's SDE window within its denoising steps, and what its log-prob needs."""
  size, start = values["decoder.window_size"], values["decoder.window_start"]
  check(size <= steps, "config.decoder.window_size", size,
         f"must be <= config.decoder.train_steps={steps} (the SDE window lies within the denoising steps)")
  check(start <= steps - size, "config.decoder.window_start", start,
         f"must be -1 or in [0, {steps - size}] (train_steps - window_size): the window ends within the steps")
  if start == -1:
    lo, hi = tuple(values["decoder.window_range"])
    check(lo + size <= steps - 1, "config.decoder.window_range", (lo, hi),
           f"a random window (window_start=-1) of window_size={size} from step {lo} would hold the final step of "
           f"train_steps={steps}; a random window never does (pass --config.decoder.window_start=0 to train "
           "every step)")
    check(hi == 0 or lo + size <= hi <= steps - 1, "config.decoder.window_range", (lo, hi),
           f"hi must be 0 (the first half) or in [lo + window_size, train_steps - 1] = [{lo + size}, {steps - 1}]")
  slide = values["decoder.window_slide_every"]
  check(slide == 0 or start == -1, "config.decoder.window_slide_every", slide,
         f"a sliding window moves its start; config.decoder.window_start={start} fixes it (pass one of them)")
  if values["decoder.logprob"] == "flow_grpo":
    check(values["decoder.sde_type"] == "cps", "config.decoder.logprob", "flow_grpo",
           "is Flow-GRPO's log-prob of a CPS step: it needs decoder.sde_type='cps'")
    check(not values["decoder.ratio_norm"], "config.decoder.logprob", "flow_grpo",
           "GRPO-Guard's normalised ratio (decoder.ratio_norm) is derived for the density; use logprob='density'")
  if values["decoder.sde_type"] == "cps":
    check(size <= steps - 1, "config.decoder.window_size", size,
           f"must be <= config.decoder.train_steps - 1 = {steps - 1} with decoder.sde_type='cps' (its final step "
           "has no noise: the window ends before it)")
    check(start <= steps - size - 1, "config.decoder.window_start", start,
           f"must be -1 or in [0, {steps - size - 1}] with decoder.sde_type='cps' (its final step has no noise: "
           "the window ends before it)")


def _draw(values, steps: int) -> None:
  """How nft, awm and dgpo draw the steps they train, within the rollout's schedule."""
  draw, slots = values["decoder.timestep_draw"], values["decoder.train_timesteps"]
  sharing = values["decoder.timestep_sharing"]
  check(values["decoder.algorithm"] != "dgpo" or sharing != "micro_batch", "config.decoder.timestep_sharing",
         sharing, "decoder.algorithm='dgpo' trains a group's images at the same steps (its shared noise), and a "
         "micro-batch takes rows of many groups: use 'group' or 'batch'")
  check(slots <= steps, "config.decoder.train_timesteps", slots, f"must be <= config.decoder.train_steps={steps} "
         "(distinct steps of the rollout's schedule per image)")
  if draw == "high_noise":
    high = values["decoder.high_noise_steps"]
    check(1 <= high <= steps, "config.decoder.high_noise_steps", high,
           f"must be in [1, config.decoder.train_steps={steps}] with decoder.timestep_draw='high_noise' (the first "
           "steps it draws from: DGPO's trunc_steps + 1)")
    check(slots <= high, "config.decoder.train_timesteps", slots,
           f"must be <= config.decoder.high_noise_steps={high} (distinct steps of the first {high})")
  if draw == "stratified":
    top = int(steps * values["decoder.stratified_fraction"])
    check(1 <= slots <= top - 1, "config.decoder.train_timesteps", slots,
           f"must be in [1, {top - 1}] with decoder.timestep_draw='stratified' (one step per stratum of steps 1 .. "
           f"int(train_steps x stratified_fraction) = {top})")
