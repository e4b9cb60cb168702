"""main.py as users launch it: bad input ends in one line before any work; the demo trains, resumes, finishes.

The README's demo command and a few bad inputs run as processes; the other cases run main.py's `__main__` in the
test's process (tests/cli.py), which a new process per case would only slow down."""

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.cli import MAIN, ROOT, TIMEOUT_S, Result, assert_one_line_error, main_in_process, run_main
from tests.train.processes import free_port

@pytest.mark.parametrize("override,message", [
    ("--config.grpo.nope=1", "unknown config key 'nope' in --config.grpo.nope=1"),
    ("--config.grpo.group_size=abc", "--config.grpo.group_size=abc: invalid literal for int()"),
    ("--config.grpo.group_size=1", "config.grpo.group_size=1: must be at least 2"),
    ("--config.data.width=100", "config.data.width=100: must be a positive multiple of 32"),
    ("--config.model.param_dtype=float16", "config.model.param_dtype='float16'"),
    ("--config.optim.learning_rate=-0.001", "config.optim.learning_rate=-0.001: must be > 0"),
    ("--config.optim.warmup_steps=-5", "config.optim.warmup_steps=-5: must be >= 0"),
    ("--config.grpo.kl=k7", "config.grpo.kl='k7': must be one of ['k1', 'k2', 'k3']"),
    ("--config.grpo.scale=median", "config.grpo.scale='median'"),
    ("--config.grpo.estimator=ppo", "config.grpo.estimator='ppo'"),
    ("--config.grpo.aggregation=sum", "config.grpo.aggregation='sum'"),
    ("--config.rewards[0].name=brightnes", "config.rewards[0].name='brightnes': no such reward"),
    ("--mode=eval", "--mode=eval needs held-out prompts: pass --config.eval.prompts_file=..."),
    ("--config.mesh.fsdp=3", "config.mesh: mesh data=1 x fsdp=3 x tensor=1 != 1 devices"),
    ("--config.lora.alpha=-1", "config.lora.alpha=-1.0: must be >= 0"),
    ("--config.lora.targets=q_proj(", "config.lora.targets='q_proj(': must be a preset ['ar', 'dit'] or a valid regex"),
    ("--config.optm.learning_rate=1e-4", "unknown config key 'optm' in --config.optm.learning_rate=1e-4: the config "
                                         "defines no such key (did you mean 'optim'?)"),
    ("--config.grpo.group_sise=4", "(did you mean 'group_size'?)"),
    ("--config.rewards[1].weight=1.0", "--config.rewards[1].weight: no such entry in the config's list"),
    ("--config.rewards[0].name=target_psnr", "demo_prompts.txt:1: reward 'target_psnr' needs 'target_image' on every "
                                             "prompt (a .jsonl line with \"target_image\": ...; 6 of 6 prompts lack it)"),
    ("--config.rewards=({'name': 'ocr_word_accuracy', 'weight': 1.0, 'kwargs': {'url': 'http://127.0.0.1:1/score'}},)",
     "demo_prompts.txt:1: reward 'ocr_word_accuracy' needs 'text' on every prompt (a .jsonl line with \"metadata\": "
     "{\"text\": ...}; 6 of 6 prompts lack it)"),
    ("--config.rewards=({'name': 'remote', 'weight': 1.0, 'kwargs': {'url': 'http://127.0.0.1:1/score'}},)",
     "reward server http://127.0.0.1:1/score (start-up check): failed after 4 attempt(s); last error: connection failed"),
    ("--config.rewards=({'name': 'brightness', 'weight': 1.0, 'kwargs': {'bogus': 1}},)",
     "config.rewards[0].kwargs: reward 'brightness' takes no argument 'bogus'; it takes none"),
    ("--config.rewards=({'name': 'clip_score', 'weight': 1.0},)",
     "config.rewards[0].kwargs: reward 'clip_score' needs 'ckpt_dir' (it takes ['ckpt_dir', 'scale', "
     "'tokenizer_dir'])"),
    ("--config.rewards=({'name': 'remote', 'weight': 1.0, 'kwargs': {'url': 'localhost:8000/score'}},)",
     "reward server url='localhost:8000/score' must be an http(s) URL"),
    ("--config.rewards=()", "config.rewards=(): must be a non-empty list"),
    ("--config.rewards[0].weight=abc", "--config.rewards[0].weight=abc: could not convert string to float"),
    ("--config.seed=x", "--config.seed=x: invalid literal for int()"),
    ("--config.grpo.group_size=4.5", "--config.grpo.group_size=4.5: invalid literal for int()"),
    ("--config.train.num_steps=0", "config.train.num_steps=0: must be >= 1"),
    ("--config.checkpoint.save_interval=0", "config.checkpoint.save_interval=0: must be >= 1"),
    ("--config.train.policies=ar+vae", "config.train.policies='ar+vae': must be one of"),
    ("--config.train.micro_batch_size=5", "config.train.micro_batch_size=5 does not divide its update's batch 16"),
    ("--config.data.prompts_file=/nonexistent.txt", "config.data.prompts_file='/nonexistent.txt': no such file"),
    ("--config.data.prompts_file=configs/data", "config.data.prompts_file='configs/data': is a folder"),
    ("--config.data.prompts_file=configs/data/i2i_demo.jsonl", "i2i_demo.jsonl:1: source_images given but "
                                                              "data.mode='t2i'"),
    ("--config.data.mode=x2y", "config.data.mode='x2y': must be one of ['t2i', 'i2i']"),
    ("--config.data.height=0", "config.data.height=0: must be a positive multiple of 32"),
    ("--config.data.max_prompt_tokens=4", "demo_prompts.txt:1: the prompt takes 16 tokens with its grids, more than "
                                          "config.data.max_prompt_tokens=4"),
    ("--config.sampling.decode_batch=3", "config.sampling.decode_batch=3 must divide the batch of 16 samples"),
    ("--config.sampling.decode_batch=-2", "config.sampling.decode_batch=-2: must be >= -1"),
    ("--config.sampling.top_p=1.5", "config.sampling.top_p=1.5: must be in (0, 1]"),
    ("--config.sampling.temperature=0", "config.sampling.temperature=0.0: must be > 0"),
    ("--config.lora.rank=-1", "config.lora.rank=-1: must be >= 0"),
    ("--config.model.preset=huge", "config.model.preset='huge': must be one of ['tiny', 'full']"),
    ("--config.model.checkpoint_dir=/nonexistent", "config.model.checkpoint_dir='/nonexistent': no such directory"),
    ("--mode=compile", "--mode=compile needs a target slice, e.g. --config.compile.topology=v5p-64"),
    ("--mode=fly", "flag --mode=fly: value should be one of <train|generate|eval|compile>"),
    ("--nosuchflag=1", "Unknown command line flag 'nosuchflag'"),
    ("--num_processes=2", "--coordinator_address, --num_processes and --process_id go together"),
    ("extra", "unexpected arguments ['extra']: every setting is a --flag"),
    ("--config.decoder.algorithm=ppo", "config.decoder.algorithm='ppo': must be one of ['flow_grpo', 'nft', 'awm', 'dgpo']"),
    ("--config.decoder.nft_beta=0", "config.decoder.nft_beta=0.0: must be in (0, 1]"),
    ("--config.decoder.ema.decay=1.0", "config.decoder.ema.decay=1.0: must be in [0, 1)"),
    ("--config.decoder.sde_type=ode", "config.decoder.sde_type='ode': must be one of ['sde', 'cps']"),
    ("--config.eval.benchmark=drawbench", "config.eval.benchmark='drawbench': must be '' or a shipped benchmark"),
    ("--config.eval.steps=0,x", "config.eval.steps='0,x': must be '' or distinct step numbers"),
])
def test_bad_config_fails_in_one_line_before_any_work(override, message, tmp_path):
  work = tmp_path / "work"
  result = main_in_process("--config=configs/demo.py", override, tmp_path=work)
  assert_one_line_error(result, message)
  assert not work.exists()  # nothing was started, not even the folder


@pytest.mark.parametrize("flags,message", [
    (("--config=configs/demo_decoder.py", "--config.decoder.dgpo_beta=50"),
     "config.decoder.dgpo_beta=50.0 does nothing in this run (config.decoder.algorithm='flow_grpo'): only "
     "decoder.algorithm='dgpo' reads it; leave it at its default 100.0"),
    (("--config=configs/demo_decoder.py:awm", "--config.decoder.nft_beta=0.5"),
     "config.decoder.nft_beta=0.5 does nothing in this run (config.decoder.algorithm='awm'): only "
     "decoder.algorithm='nft' reads it"),
    (("--config=configs/demo_decoder.py:awm", "--config.decoder.awm_weighting=uniform",
      "--config.decoder.awm_ghuber_power=0.5"),
     "config.decoder.awm_ghuber_power=0.5 does nothing in this run (config.decoder.awm_weighting='uniform')"),
    (("--config=configs/demo_decoder.py:nft", "--config.decoder.high_noise_steps=7"),
     "config.decoder.high_noise_steps=7 does nothing in this run (config.decoder.timestep_draw='uniform'): only "
     "decoder.timestep_draw='high_noise' reads it; leave it at its default 0"),
    (("--config=configs/demo_decoder.py:nft", "--config.decoder.stratified_fraction=0.5"),
     "config.decoder.stratified_fraction=0.5 does nothing in this run (config.decoder.timestep_draw='uniform'): "
     "only decoder.timestep_draw='stratified' reads it"),
    (("--config=configs/demo_decoder.py", "--config.decoder.ema.flat=75"),
     "config.decoder.ema.flat=75 does nothing in this run (config.decoder.ema.every=0): only a moving average "
     "(decoder.ema.every >= 1) reads it"),
    (("--config.grpo.tis_mode=sequence_mask",),
     "config.grpo.tis_mode='sequence_mask' does nothing in this run (config.grpo.tis_cap=0.0): only truncated "
     "importance sampling (grpo.tis_cap > 0) reads it"),
    (("--config.log.wandb_mode=offline",), "config.log.wandb_mode='offline' does nothing in this run "
                                           "(config.log.wandb=False): only W&B logging (log.wandb=True) reads it"),
    (("--config.eval.drift_lpips_dir=/tmp",), "config.eval.drift_lpips_dir='/tmp' does nothing in this run "
                                              "(--mode=train): only --mode=eval reads it"),
    (("--config=configs/demo_decoder.py", "--config.decoder.loss_guidance=1.0"),
     "config.decoder.loss_guidance=1.0 does nothing in this run (config.decoder.algorithm='flow_grpo'): only "
     "decoder.algorithm 'nft', 'awm' or 'dgpo' reads it"),
    (("--config=configs/demo_decoder.py:awm", "--config.decoder.dgpo_clip_dsm=True"),
     "config.decoder.dgpo_clip_dsm=True does nothing in this run (config.decoder.algorithm='awm'): only "
     "decoder.algorithm='dgpo' reads it"),
    (("--config=configs/demo_decoder.py", "--config.decoder.timestep_sharing=batch"),
     "config.decoder.timestep_sharing='batch' does nothing in this run (config.decoder.algorithm='flow_grpo'): "
     "only decoder.algorithm 'nft', 'awm' or 'dgpo' reads it"),
    (("--config=configs/demo_decoder.py:nft", "--config.decoder.noise_level=0.9"),
     "config.decoder.noise_level=0.9 does nothing in this run (config.decoder.algorithm='nft'): only "
     "decoder.algorithm='flow_grpo' reads it"),
    (("--config=configs/demo_decoder.py:nft", "--config.decoder.clip_range=0.2"),
     "config.decoder.clip_range=0.2 does nothing in this run (config.decoder.algorithm='nft', "
     "config.decoder.dgpo_clip_dsm=False): only decoder.algorithm 'flow_grpo' or 'awm', or 'dgpo' with "
     "decoder.dgpo_clip_dsm=True reads it"),
    (("--config.decoder.optim.learning_rate=0.001",),
     "config.decoder.optim.learning_rate=0.001 does nothing in this run (config.train.policies='ar'): only the "
     "decoder policy (train.policies='decoder' or 'ar+decoder') reads it"),
    (("--config=configs/demo_decoder.py:dgpo", "--config.train.policies=ar"),
     "does nothing in this run (config.train.policies='ar'): only the decoder policy"),
], ids=["dgpo_beta", "nft_beta", "ghuber_power", "high_noise_steps", "stratified_fraction", "ema_flat", "tis_mode",
        "wandb_mode", "lpips_dir", "loss_guidance", "dgpo_clip_dsm", "timestep_sharing", "noise_level", "clip_range",
        "decoder_on_ar", "decoder_recipe_on_ar"])
def test_a_setting_that_nothing_reads_is_refused_in_one_line(flags, message, tmp_path):
  """One rule for every section (glmrl/config/inert.py READ_WHEN); before, each of these passed silently."""
  config = () if any(f.startswith("--config=") for f in flags) else ("--config=configs/demo.py",)
  result = main_in_process(*config, *flags, tmp_path=tmp_path / "work")
  assert_one_line_error(result, message)
  assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("flags,message", [
    (("--config.decoder.algorithm=nft", "--config.decoder.window_range=(0,0)", "--config.decoder.ema.every=0"),
     "config.decoder.ema.every=0: decoder.algorithm='nft' samples with and contrasts against the moving average"),
    (("--config.decoder.algorithm=awm", "--config.decoder.window_range=(0,0)", "--config.decoder.ema_beta=0.1"),
     "config.decoder.ema.every=0: config.decoder.ema_beta=0.1 anchors to the moving average"),
    (("--config.decoder.algorithm=awm", "--config.decoder.window_range=(0,0)", "--config.decoder.train_timesteps=5"),
     "config.decoder.train_timesteps=5: must be <= config.decoder.train_steps=4"),
    (("--config.decoder.algorithm=dgpo", "--config.decoder.window_range=(0,0)",
      "--config.decoder.timestep_draw=high_noise"),
     "config.decoder.high_noise_steps=0: must be in [1, config.decoder.train_steps=4] with "
     "decoder.timestep_draw='high_noise'"),
    (("--config.decoder.algorithm=dgpo", "--config.decoder.window_range=(0,0)",
      "--config.decoder.timestep_draw=high_noise", "--config.decoder.high_noise_steps=2",
      "--config.decoder.train_timesteps=3"),
     "config.decoder.train_timesteps=3: must be <= config.decoder.high_noise_steps=2"),
    (("--config.decoder.algorithm=awm", "--config.decoder.window_range=(0,0)",
      "--config.decoder.timestep_draw=stratified"),
     "config.decoder.train_timesteps=0: must be in [1, 2] with decoder.timestep_draw='stratified' (one step per "
     "stratum of steps 1 .. int(train_steps x stratified_fraction) = 3)"),
    (("--config.decoder.algorithm=dgpo", "--config.decoder.window_range=(0,0)",
      "--config.decoder.timestep_sharing=micro_batch"),
     "config.decoder.timestep_sharing='micro_batch': decoder.algorithm='dgpo' trains a group's images at the same "
     "steps"),
    (("--config.decoder.algorithm=dgpo", "--config.decoder.window_range=(0,0)", "--config.decoder.dgpo_clip_dsm=True"),
     "config.decoder.ema.every=0: config.decoder.dgpo_clip_dsm clips against the moving average"),
    (("--config.decoder.sde_type=cps", "--config.decoder.window_start=2"),
     "config.decoder.window_start=2: must be -1 or in [0, 1] with decoder.sde_type='cps'"),
    (("--config.decoder.window_start=3",), "config.decoder.window_start=3: must be -1 or in [0, 2]"),
    (("--config.decoder.window_range=(0,4)",), "config.decoder.window_range=(0, 4): hi must be 0 (the first half) "
                                               "or in [lo + window_size, train_steps - 1] = [2, 3]"),
    (("--config.decoder.window_range=(2,0)",), "a random window (window_start=-1) of window_size=2 from step 2 "
                                               "would hold the final step of train_steps=4"),
    (("--config.decoder.adv_std=none",), "config.decoder.adv_std='none': must be one of ['group', 'batch']"),
    (("--use_ema", "--mode=generate"), "--use_ema=True: the run keeps no moving average"),
    (("--config=configs/demo_decoder.py:nft", "--use_ema"), "--use_ema=True: --mode=train takes no --use_ema"),
    # Only the prompts taken are checked, and the line says which value fits them.
    (("--config=configs/demo.py", "--mode=eval", "--config.eval.benchmark=ocr:2", "--config.eval.steps=0",
      "--config.data.max_prompt_tokens=45"),
     "ocr.jsonl:995: its quoted texts take 20 glyph tokens, more than config.data.max_glyph_tokens=16 (found 'Danger "
     "High Voltage'; GLM-Image draws every span in '', “”, \"\" or 「」, apostrophes included); 1 of 2 prompts exceed "
     "it; --config.data.max_glyph_tokens=20 fits them all"),
    (("--config=configs/demo.py", "--mode=eval", "--config.eval.benchmark=geneval:4", "--config.eval.steps=0",
      "--config.rewards=({'name': 'geneval', 'weight': 1.0, 'kwargs': {'url': 'http://127.0.0.1:1/score'}},)"),
     "reward server http://127.0.0.1:1/score (start-up check): failed after 4 attempt(s); last error: connection failed"),
])
def test_bad_decoder_settings_fail_in_one_line_before_any_work(flags, message, tmp_path):
  """(And the evaluation's detector that refuses: GenEval on its benchmark, the training prompts unread.)"""
  work = tmp_path / "work"
  config = () if any(f.startswith("--config=") for f in flags) else ("--config=configs/demo_decoder.py",)
  result = main_in_process(*config, *flags, tmp_path=work)
  assert_one_line_error(result, message)
  assert not work.exists()


@pytest.mark.parametrize("config_text,arg,message", [
    (None, "--config=configs/nosuch.py", "--config=configs/nosuch.py: no such file"),
    (None, "--config=configs", "--config=configs: no such file (a folder)"),
    (None, "--config=configs/demo.py:foo", "unknown config argument 'foo'; this config takes none"),
    (None, "--config=configs/glm_image_t2i.py:huge", "unknown config argument 'huge'; expected nothing or 'tiny'"),
    (None, "--config=configs/glm_image_t2i_lora.py:tiny,hps", "unknown config argument 'tiny,hps'; expected "
                                                              "nothing or one of ['tiny', 'hps', 'hps,tiny']"),
    (None, "--config=configs/glm_image_t2i_decoupled.py:hps", "unknown config argument 'hps'; expected nothing or "
                                                              "'tiny'"),
    (None, "--config=configs/glm_image_t2i_lora.py:hps,tiny", "config.rewards[0].kwargs.ckpt_dir is required but "
                                                              "has no value (pass --config.rewards[0].kwargs.ckpt_dir="),
    ("def get_config(:\n", "", ":1: invalid syntax (a syntax error in the config file)"),
    ("x = 1\n", "", ": defines no get_config(arg) function"),
    ("import glmrl_nosuch\n", "", "my_config.py:1: ModuleNotFoundError: No module named 'glmrl_nosuch' (raised by the "
                                   "config file)"),
    ("def get_config(arg=None):\n  raise RuntimeError('boom')\n", "", "my_config.py:2: RuntimeError: boom"),
    ("from configs import demo\ndef get_config(arg=None):\n  c = demo.get_config()\n  c.optm.learning_rate = 1.0\n"
     "  return c\n", "", "my_config.py:4: AttributeError: the config has no key 'optm' (did you mean 'optim'?)"),
    ("from configs import demo\ndef get_config(arg=None):\n  c = demo.get_config()\n  c.optim.lerning_rate = 1.0\n"
     "  return c\n", "", "config.optim.lerning_rate is not a config key (did you mean config.optim.learning_rate?)"),
    ("from configs import demo\ndef get_config(arg=None):\n  c = demo.get_config()\n"
     "  c.optim.learning_rate = '1e-4'\n  return c\n", "", "my_config.py:4: TypeError: Could not override field "
                                                          "'learning_rate'"),
    ("def get_config(arg=None):\n  return None\n", "", "get_config() returned NoneType, not an "
                                                       "ml_collections.ConfigDict"),
    ("def get_config(arg=None):\n  return {'a': 1}\n", "", "get_config() returned dict, not an "
                                                           "ml_collections.ConfigDict"),
])
def test_bad_config_file_fails_in_one_line(config_text, arg, message, tmp_path):
  if config_text is not None:
    (tmp_path / "my_config.py").write_text(config_text)
    arg = f"--config={tmp_path / 'my_config.py'}"
  work = tmp_path / "work"
  assert_one_line_error(main_in_process(arg, tmp_path=work), message)
  assert not work.exists()


@pytest.mark.parametrize("workdir,message", [
    ("", "--workdir is empty"), ("a_file", "a_file: is a file, not a folder")])
def test_bad_workdir_fails_in_one_line(workdir, message, tmp_path):
  (tmp_path / "a_file").write_text("")
  result = main_in_process(f"--workdir={workdir and tmp_path / workdir}", tmp_path=tmp_path / "unused")
  assert_one_line_error(result, message)
  assert os.listdir(tmp_path) == ["a_file"]


@pytest.mark.parametrize("args,message", [
    (("--config=configs/demo.py", "--config.grpo.nope=1"), "unknown config key 'nope' in --config.grpo.nope=1"),
    (("--config=configs/demo.py", "--config.grpo.group_size=1"), "config.grpo.group_size=1: must be at least 2"),
    (("--config=configs/nosuch.py",), "--config=configs/nosuch.py: no such file"),
    (("--config=configs/demo_decoder.py", "--use_ema", "--mode=generate"),
     "--use_ema=True: the run keeps no moving average"),
], ids=["flag", "config_check", "config_file", "mode_flag"])
def test_main_py_as_a_process_ends_bad_input_in_one_line(args, message, tmp_path):
  """The cases above run main.py's `__main__` in the test's process (tests/cli.py); these launch `python main.py`
  as users do, one per stage that refuses (absl's parser, the config file, the config checks, main's own flags):
  exit status 2, the one line, nothing written."""
  work = tmp_path / "work"
  assert_one_line_error(run_main(*args, tmp_path=work), message)
  assert not work.exists()


def _garbage_step(work):
  (work / "checkpoints" / "5").mkdir(parents=True)
  (work / "checkpoints" / "5" / "x").write_bytes(os.urandom(5000))


@pytest.mark.parametrize("make,message", [
    (lambda w: (w / "checkpoints").write_text(""), "checkpoints is a file; runs keep their training checkpoints in a folder"),
    (lambda w: (w / "metrics.jsonl").mkdir(), "metrics.jsonl is a folder; runs keep their per-step metrics in a file"),
    (_garbage_step, "is complete: step 5: FileNotFoundError"),
], ids=["checkpoints_file", "metrics_folder", "garbage_step"])
def test_a_workdir_holding_the_wrong_things_fails_in_one_line_and_is_left_as_it_was(make, message, tmp_path):
  """Never "already complete" without a step that reads (a garbage folder named 5 against num_steps=2)."""
  work = tmp_path / "work"
  work.mkdir()
  make(work)
  before = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
  assert_one_line_error(main_in_process("--config=configs/demo.py", "--config.train.num_steps=2", tmp_path=work),
                        message)
  assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == before


def _step_folder(root):
  step = root / "run" / "checkpoints" / "60"
  (step / "params").mkdir(parents=True)
  (step / "_CHECKPOINT_METADATA").write_text("{}")
  return step


def _export(root):
  (root / "export").mkdir()
  (root / "export" / "model_index.json").write_text("{}")
  return root / "export"


def _converted(root):
  (root / "converted" / "transformer" / "params").mkdir(parents=True)
  return root / "converted"


@pytest.mark.parametrize("mode", ["eval", "generate", "train"])
@pytest.mark.parametrize("make,message", [
    (_step_folder, "/run/checkpoints/60 is a checkpoint (step 60), not a run's folder: pass --workdir={root}/run "
                   "(--mode=eval takes the step as --config.eval.steps=60)"),
    (lambda root: _step_folder(root).parent, "/run/checkpoints is a run's checkpoints folder, not the run's folder: "
                                             "pass --workdir={root}/run"),
    (_export, "/export holds an HF pipeline folder (model_index.json), not a run's folder"),
    (_converted, "/converted holds a converted checkpoint (transformer/params), not a run's folder: name it with "
                 "--config.model.checkpoint_dir"),
], ids=["step", "checkpoints", "export", "converted"])
def test_a_folder_that_is_not_a_runs_is_refused_in_one_line_and_left_as_it_was(make, message, mode, tmp_path):
  """Before, `--mode=eval --workdir=W/checkpoints/60` evaluated the initial models and wrote its report there."""
  work = make(tmp_path)
  before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
  flags = ("--config.eval.benchmark=parti:2",) if mode == "eval" else ()
  result = main_in_process("--config=configs/demo.py", f"--mode={mode}", *flags, tmp_path=work)
  assert_one_line_error(result, message.format(root=tmp_path))
  assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def _ar_run(work, **overrides):
  """A workdir as an AR demo run leaves it: its config.json and a step folder (what the early check reads)."""
  from configs import demo
  from glmrl.train import resolved_config

  (work / "checkpoints" / "2").mkdir(parents=True)
  config = demo.get_config()
  for key, value in overrides.items():
    section, name = key.split("__")
    config[section][name] = value
  resolved_config.write(config, str(work))
  return work


@pytest.mark.parametrize("mode", ["train", "eval", "generate"])
@pytest.mark.parametrize("flags,recorded,message", [
    (("--config=configs/demo_decoder.py",), {}, "holds checkpoints of a run with config.train.policies='ar' "
                                               "({work}/config.json); this config has 'decoder'"),
    (("--config=configs/demo.py", "--config.lora.rank=4"), {}, "with config.lora.rank=0 ({work}/config.json); this "
                                                               "config has 4"),
    (("--config=configs/demo.py", "--config.lora.rank=4", "--config.lora.alpha=2.0"),
     {"lora__rank": 4, "lora__alpha": 8.0}, "with config.lora.alpha=8.0 ({work}/config.json); this config has 2.0"),
], ids=["policies", "lora_vs_full", "lora_alpha"])
def test_a_workdir_of_another_run_is_refused_before_any_model_is_built(flags, recorded, message, mode, tmp_path):
  """Before, an AR workdir resumed or evaluated with the decoder config was refused 26-40 s later, after the build."""
  work = _ar_run(tmp_path / "work", **recorded)
  extra = ("--config.eval.benchmark=parti:2",) if mode == "eval" else ()
  result = main_in_process(*flags, f"--mode={mode}", *extra, tmp_path=work)
  assert_one_line_error(result, message.format(work=work) + f": pass --config={work}/config.json (then your flags), "
                                                           "or a new --workdir")
  assert sorted(os.listdir(work)) == ["checkpoints", "config.json", "config.py"]


@pytest.mark.parametrize("make,message", [
    (lambda d: None, "not a converted LPIPS folder: it needs config.json and params/"),
    (lambda d: ((d / "params").mkdir(), (d / "config.json").write_text('{"net": "alex", "version": "0.1"}')),
     "config.json is not an LPIPS config (LPIPS config: only net='vgg' version='0.1' is supported, got net='alex'"),
    (lambda d: ((d / "params").mkdir(), (d / "config.json").write_text("{not json")),
     "config.json is not an LPIPS config (Expecting property name"),
], ids=["empty", "other_net", "not_json"])
def test_an_lpips_folder_that_is_not_one_is_refused_before_any_model(make, message, tmp_path):
  lpips = tmp_path / "lpips"
  lpips.mkdir()
  make(lpips)
  result = main_in_process("--config=configs/demo.py", "--mode=eval", "--config.eval.benchmark=parti:2",
                           "--config.eval.steps=0", f"--config.eval.drift_lpips_dir={lpips}", tmp_path=tmp_path / "w")
  assert_one_line_error(result, f"config.eval.drift_lpips_dir='{lpips}': ")
  assert message in result.stderr
  assert not (tmp_path / "w").exists()


def test_eval_of_a_folder_without_checkpoints_asks_for_step_0_in_one_line(tmp_path):
  result = main_in_process("--config=configs/demo.py", "--mode=eval", "--config.eval.benchmark=parti:2",
                           tmp_path=tmp_path / "new")
  assert_one_line_error(result, f"--mode=eval: {tmp_path}/new/checkpoints holds no checkpoint to evaluate: pass a "
                                "training run's --workdir, or --config.eval.steps=0 to evaluate the initial models")
  assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("config,flag,model", [
    ("configs/demo.py", "--config.lora.targets=nomatch", "GlmImageAR"),
    ("configs/demo_decoder.py", "--config.decoder.lora.targets=nomatch", "GlmImageDiT")])
def test_lora_targets_that_match_nothing_fail_before_any_weight_is_made(config, flag, model, tmp_path):
  result = main_in_process(f"--config={config}", "--config.lora.rank=4", flag, tmp_path=tmp_path)
  assert_one_line_error(result, f"lora target 'nomatch' matches no linear layer of {model}")
  assert "loading" not in result.stderr  # checked on the abstract model, before any component is built
  assert not os.listdir(tmp_path)


def test_bad_prompt_file_names_file_and_line(tmp_path):
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text('{"prompt": "a cat"}\n{"prompt": "a dog",}\n')
  work = tmp_path / "work"
  result = main_in_process("--config=configs/demo.py", f"--config.data.prompts_file={prompts}", tmp_path=work)
  assert_one_line_error(result, f"{prompts}:2: bad JSON")
  assert not work.exists()
  # One 2 MB word: the demo's tokenizer (built from the prompts' words) reads it as one token.
  prompts.write_text('{"prompt": "a cat"}\n{"prompt": "' + "x" * 2_000_000 + '"}\n')
  result = main_in_process("--config=configs/demo.py", f"--config.data.prompts_file={prompts}", tmp_path=work)
  assert_one_line_error(result, f"{prompts}:2: the prompt has 2000000 characters, more than "
                                "config.data.max_prompt_tokens=")


@pytest.mark.parametrize("config,prompts", [("configs/glm_image_t2i.py", "configs/data/demo_prompts.txt"),
                                            ("configs/glm_image_i2i.py", "configs/data/i2i_demo.jsonl")])
def test_released_configs_take_their_required_values_from_flags(config, prompts, tmp_path):
  result = main_in_process(f"--config={config}", tmp_path=tmp_path)
  assert_one_line_error(result, "config.model.checkpoint_dir is required but has no value "
                                "(pass --config.model.checkpoint_dir=...)")
  result = main_in_process(f"--config={config}", f"--config.model.checkpoint_dir={tmp_path}", tmp_path=tmp_path)
  assert_one_line_error(result, "config.data.prompts_file is required")
  result = main_in_process(f"--config={config}", f"--config.model.checkpoint_dir={tmp_path}",
                    f"--config.data.prompts_file={prompts}", tmp_path=tmp_path)
  # The values were taken: what stops the run now is the empty folder standing in for a checkpoint.
  assert_one_line_error(result, f"{tmp_path}/vision_language_encoder/config.json not found")


def test_help_points_to_the_keys_and_what_each_mode_writes(tmp_path):
  result = subprocess.run([sys.executable, MAIN, "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=TIMEOUT_S)
  assert result.returncode == 0
  for text in ("configs/common.py", "checkpoints/<step>/", "generate/", "metrics.jsonl", "143", "config.eval.benchmark",
               "config.eval.steps", "index.html"):
    assert text in result.stdout, text


def _rows(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("flags,message", [
    (("--coordinator_address=http://localhost:1234",), "--coordinator_address=http://localhost:1234: HOST:PORT "
                                                       "without a scheme, e.g. localhost:1234"),
    (("--coordinator_address=localhost",), "--coordinator_address=localhost: expected HOST:PORT"),
    (("--coordinator_address=localhost:{port}", "--distributed_timeout=1"),
     "process 0 waited 1 s (--distributed_timeout) for process(es) 1 of 2: start each with the same "
     "--coordinator_address, --num_processes=2 and its own --process_id"),
], ids=["scheme", "no_port", "peer_missing"])
def test_a_pod_launch_mistake_that_one_process_sees_is_one_line(flags, message, tmp_path):
  """Process 0 of two (glmrl/runtime/rendezvous.py): ends before the coordinator starts, nothing written."""
  port = free_port()
  flags = [f.format(port=port) for f in flags]
  work = tmp_path / "work"
  result = main_in_process("--config=configs/demo.py", *flags, "--num_processes=2", "--process_id=0", tmp_path=work)
  assert_one_line_error(result, message)
  assert not work.exists()


def test_two_processes_that_disagree_each_end_in_one_line(tmp_path):
  """As users launch them, with --num_processes=2 for process 0 and 3 for process 1: both exit 2 within the
  deadline with the same reason, nothing written (before, both trained and exited 0)."""
  work, port = tmp_path / "work", free_port()
  common = ("--config=configs/demo.py", f"--coordinator_address=localhost:{port}", "--distributed_timeout=120")
  procs = [subprocess.Popen([sys.executable, MAIN, f"--workdir={work}", *common, f"--num_processes={n}",
                             f"--process_id={i}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i, n in ((0, 2), (1, 3))]
  results = []
  for p in procs:
    out, err = p.communicate(timeout=TIMEOUT_S)
    results.append(Result(p.returncode, out, err))
  reason = "process 1 was started with --num_processes=3 and process 0 with --num_processes=2"
  assert_one_line_error(results[0], f"error: {reason}")
  assert_one_line_error(results[1], f"error: process 0 refused this run: {reason}")
  assert not work.exists()


def test_a_workdir_in_use_by_another_run_is_refused(tmp_path):
  holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
  try:
    (tmp_path / "lock.json").write_text(json.dumps({"host": socket.gethostname(), "pid": holder.pid,
                                                    "started": "2026-11-24 08:00:00"}))
    result = main_in_process("--config=configs/demo.py", tmp_path=tmp_path)
  finally:
    holder.kill()
    holder.wait()
  assert_one_line_error(result, f"is in use by another training run (host {socket.gethostname()}, pid {holder.pid}")
  assert os.listdir(tmp_path) == ["lock.json"]


def test_demo_trains_resumes_without_duplicates_and_knows_when_it_is_done(tmp_path):
  """The README's first command (fewer steps), rerun, then extended: as a user would drive it; logging to W&B
  offline as well, the resumed run continuing the first one's W&B run."""
  args = ("--config=configs/demo.py", "--config.checkpoint.save_interval=2", "--config.log.image_interval=2",
          "--config.log.wandb=True", "--config.log.wandb_mode=offline")
  # A lock left by a run that was killed (a process of this host that has ended) is taken over.
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  (tmp_path / "lock.json").write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone.stdout),
                                                  "started": "2026-11-24 08:00:00"}))
  first = run_main(*args, "--config.train.num_steps=3", tmp_path=tmp_path)
  assert first.returncode == 0, first.stderr[-3000:]
  assert "taking over" in first.stderr and not (tmp_path / "lock.json").exists()
  assert json.loads((tmp_path / "config.json").read_text())["train"]["num_steps"] == 3
  assert f"config in {tmp_path / 'config.json'}" in first.stderr
  assert "step 3/3 |" in first.stderr and "ETA" in first.stderr and "reward" in first.stderr
  assert "done: 3 steps in" in first.stderr and f"checkpoints in {tmp_path / 'checkpoints'}" in first.stderr
  assert f"metrics in {tmp_path / 'metrics.jsonl'}; TensorBoard events in {tmp_path}; sample grids in " \
         f"{tmp_path / 'samples'}" in first.stderr
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3]
  assert {"2", "3"} <= set(os.listdir(tmp_path / "checkpoints"))
  assert sorted(os.listdir(tmp_path / "samples"))  # grids at steps 1 and 2
  # The reward-hacking monitors: image statistics every step, JPEG size on the steps that fetch the images.
  rows = _rows(tmp_path)
  assert all(0 <= r["monitor/saturation"] <= 1 and 0 <= r["monitor/near_constant_frac"] <= 1
             and r["monitor/pairwise_distance"] > 0 for r in rows)
  assert [r["step"] for r in rows if "monitor/jpeg_kb" in r] == [1, 2]

  again = main_in_process(*args, "--config.train.num_steps=3", tmp_path=tmp_path)
  assert again.returncode == 0 and "already complete" in again.stderr, again.stderr[-3000:]
  assert len(_rows(tmp_path)) == 3

  # A crash after step 3's metrics but before its checkpoint leaves a row the resumed run redoes.
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 4, "reward/mean": 0.0}) + "\n")
  # The workdir's config.py gives the run's resolved config back: it extends the run as the flags did.
  more = main_in_process(f"--config={tmp_path / 'config.py'}", "--config.train.num_steps=4", tmp_path=tmp_path)
  assert more.returncode == 0, more.stderr[-3000:]
  assert "done: 1 step (step 4) in" in more.stderr, more.stderr[-3000:]
  # Resumed with another prompts file: one line before any model, naming the file and what differs.
  fewer = tmp_path / "fewer.txt"
  fewer.write_text("a red cat\na blue dog\n")
  changed = main_in_process(*args, f"--config.data.prompts_file={fewer}", "--config.train.num_steps=5",
                            tmp_path=tmp_path)
  assert_one_line_error(changed, f"{fewer}: the checkpoint to resume was saved with other prompts or another "
                                 "config.seed (iterator state num_records=")
  assert json.loads((tmp_path / "config.json").read_text())["checkpoint"]["save_interval"] == 2
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3, 4]
  assert _rows(tmp_path)[-1]["reward/mean"] != 0.0
  # W&B has every step's scalars as metrics.jsonl has them (the resumed run's step 4, not the crashed row), the
  # grids of steps 1, 2 and 4 (as samples/), and one W&B run: every launch continued the first one's.
  from tests.logging import wandb_records
  history = wandb_records.history(tmp_path)
  logged = {r["_step"]: r["reward/mean"] for r in history if "reward/mean" in r}
  assert logged == {r["step"]: pytest.approx(r["reward/mean"], rel=1e-6) for r in _rows(tmp_path)}
  assert sorted(r["_step"] for r in history if "train_samples/path" in r) == [1, 2, 4]
  assert len({r["id"] for r in wandb_records.runs(tmp_path)}) == 1


def test_a_reward_server_that_stops_answering_ends_the_run_in_one_line_with_its_steps_saved(tmp_path):
  """A server answering the start-up check and two steps, then HTTP 500: the run ends at step 3 in one line
  naming the server and the saved step 2 (save_interval 10 would have kept none); the rerun resumes there."""
  import threading

  from glmrl.rewards import server as server_lib

  calls = []

  def failing_after_two_steps(images, prompts, metadata):
    calls.append(len(images))
    if sum(calls) > 1 + 2 * 16:  # the start-up check's image, then steps 1 and 2 (16 images each, a request per
      raise RuntimeError("scorer lost its GPU")  # decoder call: chunk_size holds any)
    return server_lib.brightness(images, prompts, metadata)

  server = server_lib.RewardServer(failing_after_two_steps, port=0)
  threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
  rewards = (f"--config.rewards=({{'name': 'remote', 'weight': 1.0, 'kwargs': {{'url': '{server.url}', "
             "'retries': 1, 'backoff_s': 0.0, 'chunk_size': 64}},)")
  args = ("--config=configs/demo.py", rewards, "--config.checkpoint.save_interval=10", "--config.log.image_interval=0")
  try:
    result = main_in_process(*args, "--config.train.num_steps=4", tmp_path=tmp_path)
    assert_one_line_error(result, f"reward server {server.url} (images 0..", before_any_work=False)
    assert "RuntimeError: scorer lost its GPU" in result.stderr
    assert f"step 2 is saved in {tmp_path / 'checkpoints'}: rerun once the server answers" in result.stderr
    assert "attempt 1 of 2 failed" in result.stderr  # the retry said so
    assert max(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == 2
    assert [r["step"] for r in _rows(tmp_path)] == [1, 2]
  finally:
    server.shutdown()
    server.server_close()


def test_demo_with_lora_adapters_learns(tmp_path):
  """The demo with rank-4 adapters (the base frozen): its reward rises as the full fine-tune's does
  (tests/train/test_learning.py: twice the random decoder's within-group spread in 30 steps)."""
  result = main_in_process("--config=configs/demo.py", "--config.lora.rank=4", "--config.lora.alpha=8",
                           "--config.optim.learning_rate=1e-2", "--config.train.num_steps=30",
                           "--config.checkpoint.save_interval=100", "--config.log.image_interval=0",
                           tmp_path=tmp_path)
  assert result.returncode == 0, (result.stderr + result.stdout)[-3000:]
  assert "LoRA rank 4" in result.stderr
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  curve = [r["reward/mean"] for r in rows]
  assert len(curve) == 30 and all(r["first_iter/ratio/min"] == r["first_iter/ratio/max"] == 1.0 for r in rows)
  assert sum(curve[-5:]) / 5 - sum(curve[:5]) / 5 > 0.01, curve


def test_a_run_that_cannot_learn_says_so(tmp_path):
  """Rewards equal within every group (grpo.std_eps above their spread): zero advantages and gradients for
  five steps in a row end in a warning each, and the streaks are metrics."""
  result = main_in_process("--config=configs/demo.py", "--config.train.num_steps=5", "--config.grpo.std_eps=0.9",
                           "--config.log.image_interval=0", tmp_path=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "policy no_signal: every group's rewards are equal" in result.stderr
  assert "policy zero_grad: the gradient is exactly zero" in result.stderr
  assert "5 steps in a row (step 5)" in result.stderr
  assert _rows(tmp_path)[-1]["watchdog/zero_grad_steps"] == 5
