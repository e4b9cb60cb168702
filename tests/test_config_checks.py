import importlib.util
import os

import pytest

from glmrl import config_checks
from configs import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name, arg=None):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def test_missing_required_value_is_named():
  cfg = common.base_config()
  with pytest.raises(config_checks.ConfigError, match=r"config.data.prompts_file is required"):
    config_checks.validate(cfg)


def test_demo_config_is_valid():
  config_checks.validate(load_config("demo"))


def test_every_config_field_is_commented():
  # Every assignment in the config files carries a comment saying what it does.
  text = open(os.path.join(ROOT, "configs", "common.py")).read().splitlines()
  fields = [line for line in text if line.strip().startswith("c.") and " = " in line
            and "ConfigDict()" not in line]
  assert fields and all("#" in line for line in fields), [l for l in fields if "#" not in l]


@pytest.mark.parametrize("key,value,message", [
    ("mesh.data", -1, "at most one axis may be -1"),
    ("sampling.top_p", 0.0, "config.sampling.top_p=0.0"),
    ("grpo.epsilon_low", 1.5, r"config.grpo.epsilon_low=1.5: must be in \[0, 1\]"),
    ("decoder.clip_range", 1.5, r"config.decoder.clip_range=1.5: must be in \(0, 1\]"),
    ("data.mode", "video", "config.data.mode='video'"),
    ("rollout.ar_weights", "tensor", r"config.rollout.ar_weights='tensor': must be one of \['auto', 'update', 'gathered'\]"),
])
def test_range_errors(key, value, message):
  cfg = load_config("demo")
  section, field = key.split(".")
  cfg[section][field] = value
  with pytest.raises(config_checks.ConfigError, match=message):
    config_checks.validate(cfg)


def test_every_field_has_a_rule():
  fields = set(config_checks.leaves(common.base_config()))
  assert fields == set(config_checks.RULES), (sorted(fields - set(config_checks.RULES)),
                                              sorted(set(config_checks.RULES) - fields))


@pytest.mark.parametrize("key,value,message", [
    ("optim.learning_rate", -1e-3, "config.optim.learning_rate=-0.001: must be > 0"),
    ("optim.warmup_steps", -5, "config.optim.warmup_steps=-5: must be >= 0"),
    ("optim.b2", 1.0, "config.optim.b2=1.0: must be in [0, 1)"),
    ("grpo.kl", "k7", "config.grpo.kl='k7': must be one of ['k1', 'k2', 'k3']"),
    ("grpo.scale", "median", "config.grpo.scale='median': must be one of"),
    ("grpo.estimator", "ppo", "config.grpo.estimator='ppo': must be one of"),
    ("grpo.aggregation", "sum", "config.grpo.aggregation='sum': must be one of"),
    ("grpo.beta", float("nan"), "config.grpo.beta=nan: must be finite"),
    ("sampling.guidance_scale", -1.0, "config.sampling.guidance_scale=-1.0: must be >= 0"),
    ("seed", -1, "config.seed=-1: must be >= 0"),
    ("data.prompts_file", "", "config.data.prompts_file='': must name a .txt or .jsonl prompts file"),
    ("data.prompts_file", "/no/such/prompts.txt", "config.data.prompts_file='/no/such/prompts.txt': no such file"),
    ("model.checkpoint_dir", "/no/such/dir", "config.model.checkpoint_dir='/no/such/dir': no such directory"),
])
def test_every_kind_of_bad_value_names_the_key(key, value, message):
  cfg = load_config("demo")
  section, _, field = key.rpartition(".")
  (cfg[section] if section else cfg)[field] = value
  with pytest.raises(config_checks.ConfigError) as e:
    config_checks.validate(cfg)
  assert message in str(e.value)


def test_rewards_are_checked_before_any_model_is_built():
  cfg = load_config("demo")
  cfg.rewards = [{"name": "brightnes", "weight": 1.0}]
  with pytest.raises(config_checks.ConfigError, match=r"config.rewards\[0\].name='brightnes': no such reward"):
    config_checks.validate(cfg)
  cfg.rewards = [{"name": "brightness", "weight": "1"}]
  with pytest.raises(config_checks.ConfigError, match=r"config.rewards\[0\].weight='1': must be a finite number"):
    config_checks.validate(cfg)
  cfg.rewards = [{"name": "brightness", "weight": 1.0, "kwarg": {}}]
  with pytest.raises(config_checks.ConfigError, match=r"unknown key\(s\) \['kwarg'\]"):
    config_checks.validate(cfg)


def test_eval_needs_held_out_prompts():
  cfg = load_config("demo")
  with pytest.raises(config_checks.ConfigError, match="--mode=eval needs held-out prompts"):
    config_checks.validate(cfg, mode="eval")
  cfg.eval.interval = 5
  with pytest.raises(config_checks.ConfigError, match="config.eval.interval=5 needs held-out prompts"):
    config_checks.validate(cfg)
  cfg.eval.prompts_file = cfg.data.prompts_file
  config_checks.validate(cfg, mode="eval")


def test_type_rules_back_up_ml_collections():
  # Locked configs already refuse a wrong type; a config file building its own ConfigDict is caught here.
  with pytest.raises(config_checks.ConfigError, match="config.model.remat=1: must be True or False, not int"):
    config_checks.RULES["model.remat"].check("config.model.remat", 1)
  with pytest.raises(config_checks.ConfigError, match="config.seed=True: must be an integer, not bool"):
    config_checks.RULES["seed"].check("config.seed", True)
  config_checks.RULES["optim.learning_rate"].check("config.optim.learning_rate", 1)  # ints are numbers


@pytest.mark.parametrize("overrides,message", [
    ({"window_slide_every": 2, "window_start": 0},
     r"config.decoder.window_slide_every=2: a sliding window moves its start; config.decoder.window_start=0 fixes"),
    ({"window_slide_every": -1}, r"config.decoder.window_slide_every=-1: must be >= 0"),
    ({"ratio_norm": True, "algorithm": "nft", "ema": {"every": 1}},
     r"config.decoder.ratio_norm=True: is flow_grpo's \(SDE windows\); config.decoder.algorithm='nft' has none"),
    ({"window_slide_stride": -2}, r"config.decoder.window_slide_stride=-2: must be >= 0"),
])
def test_sliding_window_and_guard_settings(overrides, message):
  cfg = load_config("demo_decoder")
  for key, value in overrides.items():
    if isinstance(value, dict):
      cfg.decoder[key].update(value)
    else:
      cfg.decoder[key] = value
  with pytest.raises(config_checks.ConfigError, match=message):
    config_checks.validate(cfg)


@pytest.mark.parametrize("impl,backend,message", [("cudnn", "gpu", "cuDNN flash attention needs NVIDIA GPUs"),
                                                   ("splash", "tpu", "Pallas splash attention is TPU's kernel")])
def test_a_flash_kernel_needs_its_platform_here_or_as_the_compile_target(impl, backend, message):
  import jax

  cfg = load_config("demo")
  cfg.model.dit_attention = impl
  if jax.default_backend() == backend:
    config_checks.validate(cfg)
  else:
    with pytest.raises(config_checks.ConfigError, match=message):
      config_checks.validate(cfg)
  # --mode=compile checks the kernel against its target's platform, whatever this host's is.
  own, other = ("h100-8", "v5p-8") if impl == "cudnn" else ("v5p-8", "h100-8")
  cfg.compile.topology, cfg.model.compute_dtype = own, "bfloat16"
  config_checks.validate(cfg, mode="compile")
  cfg.compile.topology = other
  with pytest.raises(config_checks.ConfigError, match=f"{message}; --config.compile.topology={other} is a"):
    config_checks.validate(cfg, mode="compile")
  if impl == "cudnn":  # and it takes 16-bit operands only
    cfg.compile.topology, cfg.model.compute_dtype = own, "float32"
    with pytest.raises(config_checks.ConfigError, match="cuDNN flash attention takes 16-bit operands; "
                                                        "config.model.compute_dtype='float32'"):
      config_checks.validate(cfg, mode="compile")


def test_wandb_logging_names_its_package_and_modes(monkeypatch):
  cfg = load_config("demo")
  cfg.log.wandb, cfg.log.wandb_mode = True, "offline"
  config_checks.validate(cfg)
  cfg.log.wandb_mode = "cloud"
  with pytest.raises(config_checks.ConfigError, match=r"config.log.wandb_mode='cloud'"):
    config_checks.validate(cfg)
  cfg.log.wandb_mode = "online"
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
  with pytest.raises(config_checks.ConfigError, match=r"config.log.wandb=True: needs the wandb package: pip install "
                                                      r"-r requirements-wandb.txt"):
    config_checks.validate(cfg)


def test_a_config_file_older_than_a_key_is_told_which_key_is_missing():
  """An older run's <workdir>/config.py holds the keys of its day: one line, not a KeyError."""
  import ml_collections
  old = load_config("demo").to_dict()
  del old["log"]["wandb"], old["optim"]["eps"]
  with pytest.raises(config_checks.ConfigError, match=r"config.optim.eps is missing \(and 1 more key\(s\)\): the "
                                                      r"config file predates it"):
    config_checks.validate(ml_collections.ConfigDict(old))
