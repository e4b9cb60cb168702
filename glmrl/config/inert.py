"""Settings read only under a condition, refused in one line where nothing in the run reads them."""

from __future__ import annotations

from glmrl.config.keys import RULES, leaves
from glmrl.config.rules import ConfigError


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
    (("decoder.ema.decay", "decoder.ema.flat", "decoder.ema.ramp", "decoder.ema.after"),
     "decoder.ema.every", lambda every: every >= 1, "a moving average (decoder.ema.every >= 1)"),
    (("grpo.tis_mode",), "grpo.tis_cap", lambda cap: cap > 0, "truncated importance sampling (grpo.tis_cap > 0)"),
    (("log.wandb_project", "log.wandb_name", "log.wandb_mode"), "log.wandb", bool, "W&B logging (log.wandb=True)"),
    (("eval.drift_lpips_dir",), "--mode", lambda mode: mode == "eval", "--mode=eval"),
)


def differs(value, default) -> bool:
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


def check_read(values: dict, mode: str) -> None:
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
      if differs(values[key], defaults[key]):
        raise ConfigError(f"config.{key}={values[key]!r} does nothing in this run ({_shown(decider, setting, mode)}): "
                          f"only {reader} reads it; leave it at its default {defaults[key]!r}")
