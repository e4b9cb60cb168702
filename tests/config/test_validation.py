import importlib.util
import os

import pytest

from glmrl.config import inert, keys, rules, validation
from configs import common
from tests.cli import ROOT


def load_config(name, arg=None):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def test_missing_required_value_is_named():
  cfg = common.base_config()
  with pytest.raises(rules.ConfigError, match=r"config.data.prompts_file is required"):
    validation.validate(cfg)


def test_demo_config_is_valid():
  validation.validate(load_config("demo"))


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
  with pytest.raises(rules.ConfigError, match=message):
    validation.validate(cfg)


def test_every_field_has_a_rule():
  fields = set(keys.leaves(common.base_config()))
  assert fields == set(keys.RULES), (sorted(fields - set(keys.RULES)),
                                              sorted(set(keys.RULES) - fields))


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
  with pytest.raises(rules.ConfigError) as e:
    validation.validate(cfg)
  assert message in str(e.value)


def test_rewards_are_checked_before_any_model_is_built():
  cfg = load_config("demo")
  cfg.rewards = [{"name": "brightnes", "weight": 1.0}]
  with pytest.raises(rules.ConfigError, match=r"config.rewards\[0\].name='brightnes': no such reward"):
    validation.validate(cfg)
  cfg.rewards = [{"name": "brightness", "weight": "1"}]
  with pytest.raises(rules.ConfigError, match=r"config.rewards\[0\].weight='1': must be a finite number"):
    validation.validate(cfg)
  cfg.rewards = [{"name": "brightness", "weight": 1.0, "kwarg": {}}]
  with pytest.raises(rules.ConfigError, match=r"unknown key\(s\) \['kwarg'\]"):
    validation.validate(cfg)


def test_eval_needs_held_out_prompts():
  cfg = load_config("demo")
  with pytest.raises(rules.ConfigError, match="--mode=eval needs held-out prompts"):
    validation.validate(cfg, mode="eval")
  cfg.eval.interval = 5
  with pytest.raises(rules.ConfigError, match="config.eval.interval=5 needs held-out prompts"):
    validation.validate(cfg)
  cfg.eval.prompts_file = cfg.data.prompts_file
  validation.validate(cfg, mode="eval")


def test_type_rules_back_up_ml_collections():
  # Locked configs already refuse a wrong type; a config file building its own ConfigDict is caught here.
  with pytest.raises(rules.ConfigError, match="config.model.remat=1: must be True or False, not int"):
    keys.RULES["model.remat"].check("config.model.remat", 1)
  with pytest.raises(rules.ConfigError, match="config.seed=True: must be an integer, not bool"):
    keys.RULES["seed"].check("config.seed", True)
  keys.RULES["optim.learning_rate"].check("config.optim.learning_rate", 1)  # ints are numbers


@pytest.mark.parametrize("overrides,message", [
    ({"window_slide_every": 2, "window_start": 0},
     r"config.decoder.window_slide_every=2: a sliding window moves its start; config.decoder.window_start=0 fixes"),
    ({"window_slide_every": -1}, r"config.decoder.window_slide_every=-1: must be >= 0"),
    ({"ratio_norm": True, "algorithm": "nft", "ema": {"every": 1}, "window_range": (0, 0)},
     r"config.decoder.ratio_norm=True does nothing in this run \(config.decoder.algorithm='nft'\): only "
     r"decoder.algorithm='flow_grpo' reads it"),
    ({"window_slide_stride": -2}, r"config.decoder.window_slide_stride=-2: must be >= 0"),
])
def test_sliding_window_and_guard_settings(overrides, message):
  cfg = load_config("demo_decoder")
  for key, value in overrides.items():
    if isinstance(value, dict):
      cfg.decoder[key].update(value)
    else:
      cfg.decoder[key] = value
  with pytest.raises(rules.ConfigError, match=message):
    validation.validate(cfg)


@pytest.mark.parametrize("impl,backend,message", [("cudnn", "gpu", "cuDNN flash attention needs NVIDIA GPUs"),
                                                   ("splash", "tpu", "Pallas splash attention is TPU's kernel")])
def test_a_flash_kernel_needs_its_platform_here_or_as_the_compile_target(impl, backend, message):
  import jax

  cfg = load_config("demo")
  cfg.model.dit_attention = impl
  if jax.default_backend() == backend:
    validation.validate(cfg)
  else:
    with pytest.raises(rules.ConfigError, match=message):
      validation.validate(cfg)
  # --mode=compile checks the kernel against its target's platform, whatever this host's is.
  own, other = ("h100-8", "v5p-8") if impl == "cudnn" else ("v5p-8", "h100-8")
  cfg.compile.topology, cfg.model.compute_dtype = own, "bfloat16"
  validation.validate(cfg, mode="compile")
  cfg.compile.topology = other
  with pytest.raises(rules.ConfigError, match=f"{message}; --config.compile.topology={other} is a"):
    validation.validate(cfg, mode="compile")
  if impl == "cudnn":  # and it takes 16-bit operands only
    cfg.compile.topology, cfg.model.compute_dtype = own, "float32"
    with pytest.raises(rules.ConfigError, match="cuDNN flash attention takes 16-bit operands; "
                                                        "config.model.compute_dtype='float32'"):
      validation.validate(cfg, mode="compile")


def test_wandb_logging_names_its_package_and_modes(monkeypatch):
  cfg = load_config("demo")
  cfg.log.wandb, cfg.log.wandb_mode = True, "offline"
  validation.validate(cfg)
  cfg.log.wandb_mode = "cloud"
  with pytest.raises(rules.ConfigError, match=r"config.log.wandb_mode='cloud'"):
    validation.validate(cfg)
  cfg.log.wandb_mode = "online"
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
  with pytest.raises(rules.ConfigError, match=r"config.log.wandb=True: needs the wandb package: pip install "
                                                      r"-r requirements-wandb.txt"):
    validation.validate(cfg)


def test_a_config_file_older_than_a_key_is_told_which_key_is_missing():
  """An older run's <workdir>/config.py holds the keys of its day: one line, not a KeyError."""
  import ml_collections
  old = load_config("demo").to_dict()
  del old["log"]["wandb"], old["optim"]["eps"]
  with pytest.raises(rules.ConfigError, match=r"config.optim.eps is missing \(and 1 more key\(s\)\): the "
                                                      r"config file predates it"):
    validation.validate(ml_collections.ConfigDict(old))


def _other_value(key, default):
  """A value of `key` that its rule accepts and that differs from `default` (None when no candidate does)."""
  rule = keys.RULES[key]
  options = [True, False, 1, 2, 3, 7, 0.5, 0.25, 1.5, 2.0, "ghuber", "cps", "high_noise", "stratified", "batch",
             "nft", "awm", "dgpo", "flow_grpo", "sde", "density", "shared", "group", "disabled", "sequence_mask",
             "update", "x", (0, 1), (1, 3)]
  if isinstance(default, str):
    options = [o for o in options if isinstance(o, str)] + [default + "x"]
  for value in options:
    try:
      rule.check(key, value)
    except rules.ConfigError:
      continue
    if inert.differs(value, default):  # pylint: disable=protected-access
      return value
  return None


def _draft_reads(config):
  """The config keys (of RULES) read while the run's plan is drafted: the policies bound to the config."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from glmrl.programs import plan  # pylint: disable=import-outside-toplevel

  reads, parent, getitem = set(), {}, ml_collections.ConfigDict.__getitem__

  def recorded(self, key):
    value = getitem(self, key)
    if isinstance(value, ml_collections.ConfigDict):
      parent[id(value)] = (id(self), key)
    reads.add((id(self), key))
    return value

  ml_collections.ConfigDict.__getitem__ = recorded
  try:
    plan.draft(config)
  finally:
    ml_collections.ConfigDict.__getitem__ = getitem

  def path(node, key):
    parts = [key]
    while node in parent:
      node, k = parent[node]
      parts.append(k)
    return ".".join(reversed(parts))
  return {path(node, key) for node, key in reads} & set(keys.RULES)


# Runs of each policy and decoder algorithm, and settings that make the conditional readers read.
_SCENARIOS = ({}, {"train.policies": "decoder"}, {"train.policies": "ar+decoder"},
              *({"train.policies": "decoder", "decoder.algorithm": a, "decoder.ema.every": 1}
                for a in ("nft", "awm", "dgpo")),
              {"train.policies": "decoder", "decoder.algorithm": "awm", "decoder.awm_weighting": "ghuber"},
              {"train.policies": "decoder", "decoder.algorithm": "dgpo", "decoder.dgpo_clip_dsm": True,
               "decoder.ema.every": 1},
              {"train.policies": "decoder", "decoder.algorithm": "dgpo", "decoder.timestep_draw": "high_noise"},
              {"train.policies": "decoder", "decoder.algorithm": "nft", "decoder.timestep_draw": "stratified",
               "decoder.ema.every": 1},
              {"grpo.tis_cap": 2.0}, {"log.wandb": True})


def _scenario(settings):
  cfg = load_config("demo")
  for key, value in settings.items():
    section, _, name = key.rpartition(".")
    node = cfg
    for part in section.split("."):
      node = node[part]
    node[name] = value
  return cfg


def test_the_inert_key_table_claims_every_conditional_key_and_never_refuses_a_read_one():
  """Walks the key table: every key of the decoder's section is claimed (a run without the decoder policy reads
  none); each claimed key set away from its default is refused in one line naming its reader in some run and
  accepted in another; and no key that a run's policies read while binding to its config is refused there."""
  defaults = keys.leaves(common.base_config())
  claimed = {}
  for row_keys, _, _, reader in inert.READ_WHEN:
    for key in row_keys:
      claimed.setdefault(key, []).append(reader)
  decoder_keys = {k for k in keys.RULES if k.startswith("decoder.")}
  assert decoder_keys <= set(claimed), sorted(decoder_keys - set(claimed))
  assert set(claimed) <= set(keys.RULES), sorted(set(claimed) - set(keys.RULES))

  def refusal(settings, key, value, mode="train"):
    values = keys.leaves(_scenario({**settings, key: value}))
    try:
      inert.check_read(values, mode)  # pylint: disable=protected-access
    except rules.ConfigError as e:
      return str(e)
    return None

  for key, readers in sorted(claimed.items()):
    value = _other_value(key, defaults[key])
    assert value is not None, key
    results = [refusal(s, key, value) for s in _SCENARIOS] + [refusal({}, key, value, mode="eval")]
    refused = [r for r in results if r is not None and r.startswith(f"config.{key}=")]
    assert refused and all("does nothing in this run" in r and "only " in r and "\n" not in r for r in refused), key
    assert any(f"only {reader} reads it" in r for r in refused for reader in readers), (key, refused)
    assert None in results, f"config.{key}={value!r} is refused in every run: nothing could ever read it"

  # The policy classes a run binds read their settings when bound: a key read there is read by that policy and
  # algorithm (a row deciding by a setting's value, e.g. decoder.ema.every, is not seen at binding).
  binding = ("train.policies", "decoder.algorithm")
  for settings in _SCENARIOS:
    values = keys.leaves(_scenario(settings))
    read = _draft_reads(_scenario(settings))
    for row_keys, decider, is_read, reader in inert.READ_WHEN:
      deciders = decider if isinstance(decider, tuple) else (decider,)
      if deciders[0] not in binding:
        continue
      setting = tuple(values[k] for k in decider) if isinstance(decider, tuple) else values[decider]
      wrongly = sorted(k for k in row_keys if k in read and not is_read(setting))
      assert not wrongly, f"{settings}: {wrongly} are read by the bound policies, yet only {reader} is said to"
