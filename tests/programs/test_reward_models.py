"""--mode=compile's rewards program with model-backed rewards (HPS v2.1, ImageReward, PickScore's layout): their
models built abstractly from the converted folders' configs (the released layouts without one), their parameters
resident on every chip as the run loads them, and the program the very scoring the run does: lowered for this CPU
host from the same abstract run and given the loaded weights, it scores as the run's `RewardComposer` does.
"""

import glmrl  # noqa: F401

import jax
import numpy as np
import pytest
from flax import nnx

from configs import glm_image_t2i_lora
from glmrl import sharding as sharding_lib
from glmrl.models.stored_module import load_module
from glmrl.errors import UserError
from glmrl.models.blip.config import ImageRewardConfig
from glmrl.models.blip.model import ImageRewardModel
from glmrl.models.clip.checkpoint import load_clip
from glmrl.programs import abstract as abstract_lib
from glmrl.programs import compile_mode as mode_lib
from glmrl.programs import report as report_lib
from glmrl.train import setup
from tests.rewards import preference_models


@pytest.fixture(scope="module")
def config(shared_runs):
  """configs/glm_image_t2i_lora.py:hps,tiny scored by HPS, ImageReward (on the tiny folders) and the JPEG size (a
  host reward, an input of the program), each standardised per group."""
  hps, image_reward = preference_models.hps(shared_runs), preference_models.image_reward(shared_runs)
  c = glm_image_t2i_lora.get_config("hps,tiny")
  c.rewards = (
      {"name": "hps", "weight": 1.0, "kwargs": {"ckpt_dir": str(hps / "converted"),
                                                "tokenizer_dir": str(hps / "tokenizer")}},
      {"name": "image_reward", "weight": 0.5, "kwargs": {"ckpt_dir": str(image_reward / "converted"),
                                                          "tokenizer_dir": str(image_reward / "bert")}},
      {"name": "jpeg_compressibility", "weight": 0.1})
  c.normalize_rewards_per_group = True
  return c


def test_the_abstract_rewards_program_scores_as_the_run(config):
  mesh = sharding_lib.make_mesh(1, 1, 1, jax.devices()[:1])
  run = abstract_lib.build(config, mesh, platform="cpu", hbm_bytes=16 * 2**30)
  program = abstract_lib.rewards(run, "ar")
  composer = setup.reward_composer(config, mesh)  # the run's
  # The resident reward models: every parameter of both, replicated, as the run loads them.
  models = run.reward_models["ar"]
  assert set(models) == {"hps", "image_reward"}
  loaded = {"hps": load_clip(config.rewards[0]["kwargs"]["ckpt_dir"]),
            "image_reward": load_module(config.rewards[1]["kwargs"]["ckpt_dir"], ImageRewardConfig, ImageRewardModel,
                                        how_to_make="")}
  states = {name: nnx.split(model)[1] for name, model in loaded.items()}
  for name, (_, _, abstract_state) in models.items():
    assert jax.tree.map(lambda x: (x.shape, x.dtype), abstract_state) == \
        jax.tree.map(lambda x: (x.shape, x.dtype), states[name]), name
  resident = run.resident_bytes()
  for name, state in states.items():
    assert resident[f"reward:{name}"] == report_lib.bytes_per_chip(state) > 0, name

  b = run.images
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, size=(b, config.data.height, config.data.width, 3), dtype=np.uint8)
  prompts = [f"a red cat {i}" for i in range(b)]
  total, components = composer(images, prompts)
  prepared = composer.prepare(prompts)
  host = {"jpeg_compressibility": components["jpeg_compressibility"]}
  got_total, got = program.lowered.compile()(states, host, images, prepared)
  for name in ("hps", "image_reward"):
    np.testing.assert_allclose(np.asarray(got[name]), components[name], rtol=1e-6, atol=1e-7, err_msg=name)
  np.testing.assert_allclose(np.asarray(got_total), total, rtol=1e-5, atol=1e-6)


def test_only_the_named_programs_compile_and_a_wrong_name_is_refused(config):
  c = config.copy_and_resolve_references()
  c.compile.topology = "v5e-8"
  c.compile.programs = "rewards"
  report = mode_lib.compile_report(c)
  assert set(report["programs"]) == {"rewards"} and report["programs_compiled"] == ["rewards"]
  resident = report["state_bytes_per_chip"]
  assert resident["reward:hps"] > 0 and resident["reward:image_reward"] > 0
  # The program reads the models' image parts: HPS' text tower embeds prompts on the host's cache, outside it.
  assert report["programs"]["rewards"]["argument_bytes"] >= resident["reward:image_reward"]
  assert "(compiled: rewards only)" in report_lib.table(report)
  c.compile.programs = "rewards,decoder_update"
  with pytest.raises(UserError, match=r"config.compile.programs='rewards,decoder_update': this run has no program "
                                      r"'decoder_update'; its programs are \['ar_reshard', 'ar_sampler', 'decoder', "
                                      r"'rewards', 'update'\]"):
    mode_lib.compile_report(c)
