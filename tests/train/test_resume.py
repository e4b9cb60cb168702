"""Resuming gives the metrics of an uninterrupted run (float32, CPU); the trained generator exports to HF."""

import glmrl  # noqa: F401

import numpy as np
from flax import nnx

import checkpoints_convert
from checkpoints_convert.maps.ar import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.train import loop
from tests.train.common import tiny_config

KEYS = ("reward/mean", "loss", "grad_norm", "advantage/std", "policy/entropy", "learning_rate", "kl")


def config():
  # The KL term to the initial policy and a periodic evaluation are on, so both are part of what resumes.
  c = tiny_config(grpo__beta=0.04, eval__interval=2)
  c.eval.prompts_file = c.data.prompts_file
  return c


def run_steps(workdir, n):
  trainer = loop.Trainer(config(), str(workdir))
  try:
    out = []
    for _ in range(n):
      out.append(trainer.step())
      trainer.save()
      if trainer.step_index % 2 == 0:
        out[-1].update(loop.evaluate_lib.run_eval(trainer.run, trainer.run.sampling_params(), trainer.writer,
                                                    trainer.step_index))
    trainer.save(force=True)
    return out, trainer.step_index, trainer.states["ar"].trainable
  finally:
    trainer.close()


def test_resume_equals_uninterrupted_and_exports(tmp_path):
  from transformers import GlmImageForConditionalGeneration

  straight, _, _ = run_steps(tmp_path / "straight", 4)
  first, step, _ = run_steps(tmp_path / "resumed", 2)
  assert step == 2
  second, step, params = run_steps(tmp_path / "resumed", 2)  # picks up the checkpoint of step 2
  assert step == 4
  assert straight[0]["kl"] == 0.0 and straight[-1]["kl"] > 0.0  # the policy moved away from its reference
  for want, got in zip(straight, first + second):
    for k in KEYS + tuple(k for k in want if k.startswith("eval/")):
      np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-9, err_msg=k)

  # The trained generator, exported from the training checkpoint, loads in transformers with our weights.
  out = tmp_path / "hf"
  checkpoints_convert.export(str(tmp_path / "resumed"), str(out), log=lambda _: None)
  hf = GlmImageForConditionalGeneration.from_pretrained(out / "vision_language_encoder").state_dict()
  key_map = KeyMap(RULES)
  for path, value in nnx.to_flat_state(params):
    hf_key, transform = key_map.flax_to_hf(flax_path_str(path))
    np.testing.assert_array_equal(hf[hf_key].numpy(), transform.to_hf(np.asarray(value)), err_msg=hf_key)
