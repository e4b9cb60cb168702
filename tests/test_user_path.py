"""The released-model path as users run it, every step a subprocess: configs, training, eval, generate, export."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.fixtures import released_folder
from tests.test_main import ROOT, run_main


def _rows(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_image_to_image_trains_past_step_two_with_evaluation(tmp_path):
  """The update donates the AR arrays; nothing else (pipeline, condition-image tokenizer, eval) may hold them."""
  result = run_main("--config=configs/glm_image_i2i.py:tiny", "--config.train.num_steps=3",
                    "--config.eval.interval=2", "--config.eval.prompts_file=configs/data/i2i_demo.jsonl",
                    tmp_path=tmp_path, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  rows = _rows(tmp_path)
  assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
  assert [r["step"] for r in rows if "eval/reward/mean" in r] == [2]
  for r in rows:
    if "reward/mean" in r:
      assert abs(r["first_iter/ratio/min"] - 1) <= 1e-6 and abs(r["first_iter/ratio/max"] - 1) <= 1e-6, r


SMALL = ("--config.data.height=64", "--config.data.width=64", "--config.sampling.dit_steps=2",
         "--config.sampling.decode_batch=2",
         "--config.grpo.group_size=2", "--config.data.prompts_per_step=2", "--config.train.micro_batch_size=2",
         "--config.checkpoint.save_interval=2", "--config.log.image_interval=1")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """A tiny released-layout folder written by transformers/diffusers, converted by the command line."""
  root = tmp_path_factory.mktemp("released")
  hf_dir = released_folder.write_hf(root / "hf")
  out = subprocess.run([sys.executable, "-m", "checkpoints_convert", f"--hf_dir={hf_dir}",
                        f"--out_dir={root / 'converted'}"], capture_output=True, text=True, cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return hf_dir, root / "converted"


@pytest.fixture(scope="module")
def t2i_run(converted, tmp_path_factory):
  """configs/glm_image_t2i.py as the README launches it, on the converted folder, shrunk by flags."""
  _, ckpt = converted
  workdir = tmp_path_factory.mktemp("t2i")
  args = ("--config=configs/glm_image_t2i.py", f"--config.model.checkpoint_dir={ckpt}",
          "--config.data.prompts_file=configs/data/demo_prompts.txt", *SMALL)
  result = run_main(*args, "--config.train.num_steps=2", tmp_path=workdir, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  return workdir, args


def test_released_t2i_config_trains_on_a_converted_checkpoint(t2i_run):
  workdir, _ = t2i_run
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:  # bf16 compute, as released: the on-policy ratio is still exactly 1
    assert abs(r["first_iter/ratio/min"] - 1) <= 1e-6 and abs(r["first_iter/ratio/max"] - 1) <= 1e-6, r
  assert {"2"} <= set(os.listdir(workdir / "checkpoints"))


def test_eval_and_generate_on_the_trained_run(t2i_run):
  workdir, args = t2i_run
  result = run_main(*args, "--mode=eval", "--config.eval.prompts_file=configs/data/demo_prompts.txt",
                    tmp_path=workdir, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  assert [r["step"] for r in _rows(workdir) if "eval/reward/mean" in r] == [2]
  result = run_main(*args, "--mode=generate", tmp_path=workdir, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  with np.load(workdir / "generate" / "tokens.npz") as npz:
    assert int(npz["step"]) == 2
  assert (workdir / "generate" / "grid.png").is_file()


def test_released_i2i_config_trains_on_a_converted_checkpoint(converted, tmp_path):
  _, ckpt = converted
  result = run_main("--config=configs/glm_image_i2i.py", f"--config.model.checkpoint_dir={ckpt}",
                    "--config.data.prompts_file=configs/data/i2i_demo.jsonl", *SMALL, "--config.train.num_steps=2",
                    tmp_path=tmp_path, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2]


def test_export_of_the_trained_run_loads_in_diffusers(t2i_run, converted, tmp_path):
  import diffusers
  import torch

  workdir, _ = t2i_run
  out = subprocess.run([sys.executable, "-m", "checkpoints_convert", "--to_hf", f"--ckpt_dir={workdir}",
                        f"--hf_out_dir={tmp_path / 'exported'}"], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "complete GLM-Image pipeline folder" in out.stdout + out.stderr
  pipe = diffusers.GlmImagePipeline.from_pretrained(tmp_path / "exported")
  generation = pipe.vision_language_encoder.generation_config
  assert (generation.temperature, generation.top_p) == (0.9, 0.75)
  source = diffusers.GlmImagePipeline.from_pretrained(converted[0])
  trained, before = pipe.vision_language_encoder.state_dict(), source.vision_language_encoder.state_dict()
  assert trained.keys() == before.keys()
  assert any(not torch.equal(trained[k], before[k]) for k in trained)  # two updates moved the generator
  for a, b in zip(pipe.transformer.state_dict().values(), source.transformer.state_dict().values()):
    assert torch.equal(a, b)  # the frozen decoder is the source's
