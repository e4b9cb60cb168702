"""Validation of an experiment config before any work starts.

Unknown keys and wrongly typed overrides are rejected by ml_collections while flags are parsed (the config is
locked). `validate` checks the rest: every field of `configs/common.py` has a rule in `glmrl.config.keys.RULES`
(type, range or choices), unset required values (`config_dict.placeholder`, read as None) are named, settings that
nothing in the run reads are refused (`glmrl.config.inert`), and the rules that span fields come last
(`glmrl.config.cross_checks`). Each message names the full key, e.g. `config.optim.learning_rate=-0.001: must be
> 0`.
"""

from __future__ import annotations

import difflib
import json
import os

import ml_collections

from glmrl.config import cross_checks, inert, recipes
from glmrl.config.choices import MODES
from glmrl.config.keys import RULES, leaves
from glmrl.config.rules import ConfigError, check


def check_use_ema(cfg, mode: str) -> None:
  """--use_ema: generate and eval only, of a run whose decoder keeps a moving average."""
  check(mode in ("generate", "eval"), "--use_ema", True,
         f"--mode={mode} takes no --use_ema (it samples with the moving average in --mode=generate and eval)")
  policies, every = cfg.train.policies, cfg.decoder.ema.every
  check("decoder" in policies and every >= 1, "--use_ema", True,
         f"the run keeps no moving average (config.train.policies={policies!r}, config.decoder.ema.every={every})")


def _check_file(key: str, path: str) -> None:
  check(not os.path.isdir(path), key, path, "is a folder: name the file of prompts in it")
  check(os.path.isfile(path), key, path, "no such file")


def _check_lpips_folder(folder: str) -> None:
  """What `python -m checkpoints_convert.lpips` writes: config.json of LPIPS-VGG16 and params/ (before any model)."""
  key, convert = "config.eval.drift_lpips_dir", "convert LPIPS: python -m checkpoints_convert.lpips"
  check(os.path.isdir(folder), key, folder, f"no such directory ({convert})")
  config_path = os.path.join(folder, "config.json")
  check(os.path.isfile(config_path) and os.path.isdir(os.path.join(folder, "params")), key, folder,
         f"not a converted LPIPS folder: it needs config.json and params/ ({convert})")
  from glmrl.models.lpips import LPIPSConfig  # pylint: disable=import-outside-toplevel

  try:
    with open(config_path, encoding="utf-8") as f:
      LPIPSConfig.from_hf(json.load(f))
  except (ValueError, TypeError, AttributeError) as e:
    check(False, key, folder, f"{config_path} is not an LPIPS config ({e}; {convert})")


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
  check(mode in MODES, "--mode", mode, f"must be one of {list(MODES)}")
  # Compiling needs shapes only: no prompts are read and no weights (without a checkpoint: the preset's).
  unread = ("data.prompts_file", "model.checkpoint_dir") if mode == "compile" else ()
  for key, rule in RULES.items():
    if key in values and not (key in unread and values[key] is None):
      rule.check(f"config.{key}", values[key])
  cross_checks.check_rewards(cfg.get("rewards"), need_kwargs=mode != "compile")
  if "decoder" in values["train.policies"]:  # before the inert keys: a recipe's rows under another algorithm
    recipes.changed_rows(values)
  inert.check_read(values, mode)

  check(not values["grpo.kl_bias_correction"] or values["grpo.beta"] > 0, "config.grpo.kl_bias_correction", True,
         "corrects the KL term, which config.grpo.beta=0 leaves out: set grpo.beta > 0, or leave it False")
  if "decoder" in values["train.policies"]:
    cross_checks.check_decoder(cfg, values, need_kwargs=mode != "compile")

  mesh = {a: values[f"mesh.{a}"] for a in ("data", "fsdp", "tensor")}
  check(list(mesh.values()).count(-1) <= 1, "config.mesh", mesh, "at most one axis may be -1")
  if mode == "compile":
    check(bool(values["compile.topology"]), "config.compile.topology", values["compile.topology"],
           "--mode=compile needs a target slice, e.g. --config.compile.topology=v5p-64 or h100-8")
    from glmrl.programs import topology  # pylint: disable=import-outside-toplevel  # names only, no backend
    platform = topology.parse(values["compile.topology"]).chip.platform
    where = f"--config.compile.topology={values['compile.topology']} is a {platform.upper()} target"
  else:
    import jax  # pylint: disable=import-outside-toplevel
    platform = jax.default_backend()
    where = f"this run's backend is {platform!r}"
  if values["model.dit_attention"] == "cudnn":
    check(platform == "gpu", "config.model.dit_attention", "cudnn",
           f"cuDNN flash attention needs NVIDIA GPUs; {where} (use 'xla' or 'auto')")
    check(values["model.compute_dtype"] in ("bfloat16", "float16"), "config.model.dit_attention", "cudnn",
           f"cuDNN flash attention takes 16-bit operands; config.model.compute_dtype={values['model.compute_dtype']!r} "
           "(use bfloat16, or 'auto', which picks XLA's kernel for float32)")
  if values["model.dit_attention"] == "splash":
    check(platform == "tpu", "config.model.dit_attention", "splash",
           f"Pallas splash attention is TPU's kernel; {where} (use 'blocked', 'xla' or 'auto')")
  if mode == "compile":
    check(not values["model.checkpoint_dir"] or os.path.isdir(values["model.checkpoint_dir"]),
           "config.model.checkpoint_dir", values["model.checkpoint_dir"], "no such directory")
    return
  ckpt = values["model.checkpoint_dir"]
  check(not ckpt or os.path.isdir(ckpt), "config.model.checkpoint_dir", ckpt,
         "no such directory (convert the HF folder first: python -m checkpoints_convert --hf_dir=... --out_dir=...)")
  _check_file("config.data.prompts_file", values["data.prompts_file"])
  check(not (values["eval.prompts_file"] and values["eval.benchmark"]), "config.eval.benchmark",
         values["eval.benchmark"], f"and config.eval.prompts_file={values['eval.prompts_file']!r} both name held-out "
         "prompts: set one")
  if mode == "eval" or values["eval.interval"]:
    why = ("--mode=eval" if mode == "eval" else f"config.eval.interval={values['eval.interval']}")
    check(bool(values["eval.prompts_file"] or values["eval.benchmark"]), "config.eval.prompts_file",
           values["eval.prompts_file"], f"{why} needs held-out prompts: pass --config.eval.prompts_file=... or "
           "--config.eval.benchmark=NAME")
  check(mode == "eval" or not values["eval.steps"], "config.eval.steps", values["eval.steps"],
         "compares checkpoints in --mode=eval only")
  if values["eval.prompts_file"] and (mode == "eval" or values["eval.interval"]):
    _check_file("config.eval.prompts_file", values["eval.prompts_file"])
  if values["eval.drift_lpips_dir"] and mode == "eval":
    _check_lpips_folder(values["eval.drift_lpips_dir"])
  if values["log.wandb"]:
    import importlib.util
    check(importlib.util.find_spec("wandb") is not None, "config.log.wandb", True,
           "needs the wandb package: pip install -r requirements-wandb.txt")
