"""The decoder algorithms' released recipes, setting by setting, as `configs/demo_decoder.py` applies them.

Each row names one setting of a repository's recipe (file and line at the pinned commit, the line's text), its value
in glmrl's config key, and, where the decoder demo cannot take it, the demo's value and why. `apply` (as
`demo_decoder.get_config` calls it) sets every row's value (the released one, or the demo's where it has its own)
and names the recipe in `config.decoder.recipe`, against whose rows every run of the config is checked
(`glmrl.config.recipes`: a flag that changes a row warns, another decoder.algorithm is refused).
`docs/gen_released_recipes.py` writes the table of docs/reference/released_recipes.md from these rows and from the
demo's config itself, and tests/docs/test_released_recipes.py fails when either drifts. The cited lines are kept in
configs/evidence/ (`docs/gen_recipe_evidence.py`, from the repositories at their commits), where each row's quote
and the value its literal gives are checked. A row without a key is a setting glmrl cannot express; its `why` says
what the demo does instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

RELEASED = object()  # `Setting.ours` when the demo takes the released value


@dataclasses.dataclass(frozen=True)
class Setting:
  what: str  # the repository's name of the setting
  where: str  # file:line at the recipe's commit
  quote: str  # that line's text (stripped), the evidence
  key: str | None  # glmrl's config key (below `config.`); None: not expressible
  released: Any  # the released value in the key's terms
  ours: Any = RELEASED  # the demo's value where it cannot take the released one
  why: str = ""  # why the demo deviates (or, without a key, what it does instead)
  # The released value from the literal the quote assigns, where it is not that literal itself (its reading in the
  # key's terms); docs/gen_recipe_evidence.py checks every assigned literal against the row.
  follows: Callable[[Any], Any] | None = None

  @property
  def deviates(self) -> bool:
    return self.key is None or self.ours is not RELEASED

  @property
  def demo_value(self) -> Any:
    return self.released if self.ours is RELEASED else self.ours


@dataclasses.dataclass(frozen=True)
class Recipe:
  algorithm: str  # decoder.algorithm and the demo's variant
  repository: str  # owner/name on GitHub
  commit: str
  recipe: str  # the config function the rows are read from
  settings: tuple[Setting, ...]


_ADV_STD = lambda global_std: "batch" if global_std else "group"  # noqa: E731  # the advantages' std

# The demo's budget: 2 prompts x 8 images, 30 rollouts of a tiny random DiT on a CPU, one learning rate for every
# variant (docs/decoder_rl.md's comparison).
_GROUP_WHY = "the CPU demo's budget: 2 prompts x 8 images per rollout"
_LR_WHY = "a tiny random DiT learns the saturation reward in 30 rollouts at this rate; every demo variant uses it"

_DGPO_CFG, _DGPO_BASE, _DGPO_TRAIN = "config/dgpo.py", "config/base.py", "scripts/train_sd3_dgpo.py"
DGPO = Recipe("dgpo", "Luo-Yihong/DGPO", "01ceb4b", "config/dgpo.py:general_ocr_sd3_4gpu", (
    Setting("sample.num_steps", f"{_DGPO_CFG}:103", "config.sample.num_steps = 10", "decoder.train_steps", 10),
    Setting("sample.guidance_scale", f"{_DGPO_CFG}:105", "config.sample.guidance_scale = 4.5",
            "decoder.train_guidance", 4.5),
    Setting("predict_v(..., cfg = False)", f"{_DGPO_TRAIN}:1120",
            "model_v = predict_v(transformer, xt, t, embeds, pooled_embeds, config, cfg = False)",
            "decoder.loss_guidance", 1.0),
    Setting("num_train_timesteps", f"{_DGPO_CFG}:28", "config.num_train_timesteps = 4", "decoder.train_timesteps", 4),
    Setting("train_timesteps = range(trunc_steps + 1)", f"{_DGPO_TRAIN}:1063",
            "train_timesteps = [step_index for step_index in range(config.trunc_steps + 1)]",
            "decoder.timestep_draw", "high_noise"),
    Setting("trunc_steps (+ 1)", f"{_DGPO_CFG}:29", "config.trunc_steps = 6 # equals to t_min = shift(0.3)",
            "decoder.high_noise_steps", 7, follows=lambda trunc_steps: trunc_steps + 1),
    Setting("generate_shared_sampled_timesteps", f"{_DGPO_TRAIN}:1064",
            "sampled_timesteps = generate_shared_sampled_timesteps(accelerator, train_timesteps, M)",
            "decoder.timestep_sharing", "batch"),
    Setting("clip_range", f"{_DGPO_CFG}:107", "config.clip_range = 1e-2", "decoder.clip_range", 1e-2),
    Setting("clip_dsm", f"{_DGPO_CFG}:39", "config.clip_dsm = True", "decoder.dgpo_clip_dsm", True),
    Setting("ema_ref updated every optimizer step", f"{_DGPO_TRAIN}:1177",
            "ema_ref.step(transformer_trainable_parameters, global_step, decay = ema_ref_decay)",
            "decoder.ema.every", 1),
    Setting("ema_ref.step after the optimizer's step", f"{_DGPO_TRAIN}:1177",
            "ema_ref.step(transformer_trainable_parameters, global_step, decay = ema_ref_decay)",
            "decoder.ema.after", "update"),
    Setting("ema_ref decay min(0.3, ...)", f"{_DGPO_TRAIN}:1176", "ema_ref_decay = min(0.3, 0.001 * global_step)",
            "decoder.ema.decay", 0.3),
    Setting("ema_ref decay ... 0.001 * global_step", f"{_DGPO_TRAIN}:1176",
            "ema_ref_decay = min(0.3, 0.001 * global_step)", "decoder.ema.ramp", 0.001),
    # The decay is read before the step is counted: the n-th optimizer step decays by 0.001 (n - 1), the first by 0.
    Setting("global_step counted after ema_ref.step", f"{_DGPO_TRAIN}:1210", "global_step += 1",
            "decoder.ema.flat", 1),
    Setting("train.beta_dpo", f"{_DGPO_CFG}:32", "config.train.beta_dpo = 100", "decoder.dgpo_beta", 100.0),
    Setting("train.beta", f"{_DGPO_CFG}:115", "config.train.beta = 0.02", "decoder.beta", 0.02),
    Setting("sample.global_std", f"{_DGPO_CFG}:124", "config.sample.global_std = True", "decoder.adv_std", "batch",
            follows=_ADV_STD),
    Setting("train.adv_clip_max", f"{_DGPO_BASE}:89", "train.adv_clip_max = 5", "decoder.adv_clip_max", 5.0),
    Setting("sample.num_image_per_prompt", f"{_DGPO_CFG}:110",
            "config.sample.num_image_per_prompt = 16 # set to be 24 for better performance.",
            "decoder.group_size", 16, ours=8, why=_GROUP_WHY),
    Setting("train.learning_rate", f"{_DGPO_BASE}:68", "train.learning_rate = 3e-4",
            "decoder.optim.learning_rate", 3e-4, ours=3e-2, why=_LR_WHY),
    Setting("train.adam_weight_decay", f"{_DGPO_BASE}:74", "train.adam_weight_decay = 1e-4",
            "decoder.optim.weight_decay", 1e-4),
    Setting("use_shared_noise", f"{_DGPO_CFG}:30", "config.use_shared_noise = True", None, True,
            why="always on for dgpo: a group's images are noised alike at their trained steps"),
    Setting("switch_ema_ref", f"{_DGPO_CFG}:31", "config.switch_ema_ref = 200", None, 200,
            why="rollouts by ema_ref after rollout 200 are not built; the demo's 30 rollouts all come before it"),
    Setting("use_dpm", f"{_DGPO_CFG}:24", "config.use_dpm = True", None, True,
            why="rollouts take the model's Euler ODE steps, not a DPM solver"),
))

_AWM_CFG = "advantage_weighted_matching/config/dgx_awm.py"
_AWM_BASE = "advantage_weighted_matching/config/base_awm.py"
_AWM_TRAIN = "advantage_weighted_matching/scripts/train_sd3_awm.py"
AWM = Recipe("awm", "scxue/advantage_weighted_matching", "be51372",
             "advantage_weighted_matching/config/dgx_awm.py:ocr_sd3_no_cfg_1node", (
    Setting("sample.num_steps", f"{_AWM_CFG}:176", "config.sample.num_steps = 14", "decoder.train_steps", 14),
    Setting("sample.guidance_scale", f"{_AWM_CFG}:178", "config.sample.guidance_scale = 1.0",
            "decoder.train_guidance", 1.0),
    Setting("train.train_timesteps", f"{_AWM_CFG}:195", "config.train.train_timesteps = 6",
            "decoder.train_timesteps", 6),
    Setting("time_type", f"{_AWM_CFG}:228", 'config.time_type = "discrete_wo_init"', "decoder.timestep_draw",
            "stratified", follows={"discrete_wo_init": "stratified"}.get),
    Setting("train.timestep_fraction", f"{_AWM_CFG}:199", "config.train.timestep_fraction = 0.9",
            "decoder.stratified_fraction", 0.9),
    # rand_u is drawn inside the loop over one GPU's training micro-batches (line 1119), once per micro-batch.
    Setting("one draw of t_indices per training micro-batch of each GPU", f"{_AWM_TRAIN}:1201",
            "rand_u = torch.rand(config.train.train_timesteps, device=accelerator.device)",
            "decoder.timestep_sharing", "micro_batch"),
    Setting("train.clip_range", f"{_AWM_CFG}:226", "config.train.clip_range = 1", "decoder.clip_range", 1.0),
    Setting("train.advantage_max", f"{_AWM_CFG}:197", "config.train.advantage_max = 1", "decoder.advantage_max", 1.0),
    Setting("train.weighting", f"{_AWM_CFG}:202", "config.train.weighting = 'ghuber'", "decoder.awm_weighting",
            "ghuber"),
    Setting("train.ghuber_power", f"{_AWM_CFG}:203", "config.train.ghuber_power = 0.25",
            "decoder.awm_ghuber_power", 0.25),
    Setting("train.ema_beta", f"{_AWM_CFG}:206", "config.train.ema_beta = 1", "decoder.ema_beta", 1.0),
    Setting("the average updated every rollout", f"{_AWM_TRAIN}:1419",
            "tgt_param.data.copy_(tgt_param.detach().data * decay + src_param.detach().clone().data * (1.0 - decay))",
            "decoder.ema.every", 1),
    Setting("train.kl_ema_decay", f"{_AWM_CFG}:205", "config.train.kl_ema_decay = 0.3", "decoder.ema.decay", 0.3),
    Setting("kl_ema_decay_type 'linear'", f"{_AWM_TRAIN}:1413",
            "decay = min(config.train.kl_ema_decay, 0.001 * global_step)", "decoder.ema.ramp", 0.001),
    Setting("train.beta", f"{_AWM_CFG}:194", "config.train.beta = 0.003", "decoder.beta", 0.003),
    Setting("sample.global_std", f"{_AWM_CFG}:211", "config.sample.global_std=True", "decoder.adv_std", "batch",
            follows=_ADV_STD),
    Setting("train.adv_clip_max", f"{_AWM_BASE}:91", "train.adv_clip_max = 5", "decoder.adv_clip_max", 5.0),
    Setting("sample.num_image_per_prompt", f"{_AWM_CFG}:184", "config.sample.num_image_per_prompt = 24",
            "decoder.group_size", 24, ours=8, why=_GROUP_WHY),
    Setting("train.learning_rate", f"{_AWM_CFG}:201", "config.train.learning_rate = 3e-4",
            "decoder.optim.learning_rate", 3e-4, ours=3e-2, why=_LR_WHY),
    Setting("train.adam_weight_decay", f"{_AWM_BASE}:76", "train.adam_weight_decay = 1e-4",
            "decoder.optim.weight_decay", 1e-4),
    Setting("train.use_sa_solver", f"{_AWM_CFG}:210", "config.train.use_sa_solver = True", None, True,
            why="rollouts take the model's Euler ODE steps, not the SA-solver"),
    Setting("time_shift", f"{_AWM_CFG}:229", "config.time_shift = 3.0", None, 3.0,
            why="the schedule is GLM-Image's own (its scheduler's shift); discrete_wo_init reads the rollout's steps"),
))

_NFT_CFG, _NFT_BASE, _NFT_TRAIN = "config/nft.py", "config/base.py", "scripts/train_nft_sd3.py"
NFT = Recipe("nft", "NVlabs/DiffusionNFT", "24af555", "config/nft.py:sd3_pickscore", (
    Setting("sample.num_steps", f"{_NFT_CFG}:20", "config.sample.num_steps = 10", "decoder.train_steps", 10),
    Setting("sample.guidance_scale", f"{_NFT_CFG}:64", "config.sample.guidance_scale = 1.0",
            "decoder.train_guidance", 1.0),
    Setting("int(num_steps * timestep_fraction 0.99)", f"{_NFT_TRAIN}:569",
            "num_train_timesteps = int(config.sample.num_steps * config.train.timestep_fraction)",
            "decoder.train_timesteps", 9),
    Setting("a randperm of the steps per image", f"{_NFT_TRAIN}:811",
            "[torch.randperm(num_timesteps_filtered, device=device) for _ in range(total_batch_size_filtered)]",
            "decoder.timestep_draw", "uniform"),
    Setting("a randperm of the steps per image", f"{_NFT_TRAIN}:811",
            "[torch.randperm(num_timesteps_filtered, device=device) for _ in range(total_batch_size_filtered)]",
            "decoder.timestep_sharing", "image"),
    Setting("beta", f"{_NFT_CFG}:61", "config.beta = 1.0", "decoder.nft_beta", 1.0),
    Setting("decay_type 1: an average, updated every step", f"{_NFT_CFG}:60", "config.decay_type = 1",
            "decoder.ema.every", 1, follows=lambda decay_type: 1 if decay_type in (1, 2) else None),
    Setting("decay_type 1: uphold", f"{_NFT_TRAIN}:177", "uphold = 0.5", "decoder.ema.decay", 0.5),
    Setting("decay_type 1: uprate", f"{_NFT_TRAIN}:176", "uprate = 0.001", "decoder.ema.ramp", 0.001),
    Setting("gradient_step_per_epoch", f"{_NFT_CFG}:104", "gradient_step_per_epoch=1,", None, 1,
            why="one optimizer step per update of the rollout's batch, as here; the average's decay is indexed by "
                "the optimizer's own step count, as the repository's by its gradient steps"),
    Setting("train.beta", f"{_NFT_CFG}:24", "config.train.beta = 0.0001", "decoder.beta", 1e-4),
    Setting("sample.global_std", f"{_NFT_BASE}:57", "sample.global_std = True", "decoder.adv_std", "batch",
            follows=_ADV_STD),
    Setting("train.adv_clip_max", f"{_NFT_BASE}:84", "train.adv_clip_max = 5", "decoder.adv_clip_max", 5.0),
    Setting("sample.num_image_per_prompt", f"{_NFT_CFG}:28", "config.sample.num_image_per_prompt = 24",
            "decoder.group_size", 24, ours=8, why=_GROUP_WHY),
    Setting("train.learning_rate", f"{_NFT_BASE}:66", "train.learning_rate = 3e-4",
            "decoder.optim.learning_rate", 3e-4, ours=3e-2, why=_LR_WHY),
    Setting("train.adam_weight_decay", f"{_NFT_BASE}:72", "train.adam_weight_decay = 1e-4",
            "decoder.optim.weight_decay", 1e-4),
    Setting('sample.solver = "dpm2"', f"{_NFT_CFG}:66", 'config.sample.solver = "dpm2"', None, "dpm2",
            why="rollouts take the model's Euler ODE steps, not DPM-Solver-2"),
))

RECIPES = {r.algorithm: r for r in (NFT, AWM, DGPO)}


def apply(config, algorithm: str) -> None:
  """Sets the rows of `algorithm`'s released recipe on `config` (the demo's value where it has its own) and names
  the recipe in `config.decoder.recipe`."""
  recipe = RECIPES[algorithm]
  config.decoder.algorithm = recipe.algorithm
  config.decoder.recipe = algorithm
  for setting in recipe.settings:
    if setting.key:
      section, _, name = setting.key.rpartition(".")
      config[section][name] = setting.demo_value
