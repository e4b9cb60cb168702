"""--to_hf of a training run writes a folder diffusers' GlmImagePipeline loads as it is: the trained
generator plus every other component and file of the converted folder the run started from."""

import filecmp
import json
import os
import shutil

import glmrl  # noqa: F401
import diffusers
import numpy as np
import pytest
import torch
from flax import nnx

from checkpoints_convert import flax_to_hf
from checkpoints_convert.__main__ import main
from checkpoints_convert.maps.ar import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.train import loop
from tests.fixtures import released_folder
from tests.train.common import tiny_config

AR = "vision_language_encoder"
OTHERS = ("transformer", "vae", "text_encoder")
COPIED = ("processor", "tokenizer", "scheduler", "model_index.json")


@pytest.fixture(scope="module")
def trained(tiny_released, tmp_path_factory):
  """(workdir, trained AR params {hf key: HF-layout array}) of one training step on the converted folder."""
  _, converted = tiny_released
  workdir = tmp_path_factory.mktemp("run") / "workdir"
  trainer = loop.Trainer(tiny_config(model__checkpoint_dir=str(converted), train__num_steps=1), str(workdir))
  try:
    trainer.step()
    assert trainer.save(force=True)
    key_map = KeyMap(RULES)
    params = {}
    for path, value in nnx.to_flat_state(nnx.merge_state(trainer.states["ar"].trainable, trainer.run.states["ar"].frozen)):
      hf_key, transform = key_map.flax_to_hf(flax_path_str(path))
      params[hf_key] = transform.to_hf(np.asarray(value))
  finally:
    trainer.close()
  return workdir, params


def load(directory):
  return diffusers.GlmImagePipeline.from_pretrained(directory)


def assert_same_state(got: torch.nn.Module, want: torch.nn.Module, name):
  got, want = got.state_dict(), want.state_dict()
  assert list(got) == list(want), name
  for key, value in want.items():
    assert torch.equal(got[key], value), f"{name}: {key}"


def test_training_run_exports_a_complete_pipeline(tiny_released, trained, tmp_path, capsys):
  hf_dir, converted = tiny_released
  workdir, params = trained
  with open(workdir / "checkpoints" / "source.json") as f:
    assert json.load(f) == {"checkpoint_dir": str(converted)}
  out = tmp_path / "exported"
  assert main(["--to_hf", f"--ckpt_dir={workdir}", f"--hf_out_dir={out}"]) == 0
  assert f"wrote a complete GLM-Image pipeline folder: {out}" in capsys.readouterr().out

  pipe, source = load(out), load(hf_dir)
  generation = pipe.vision_language_encoder.generation_config
  assert (generation.temperature, generation.top_p) == (released_folder.TEMPERATURE, released_folder.TOP_P)
  # The generator holds the trained parameters, which moved away from the source's.
  exported = pipe.vision_language_encoder.state_dict()
  assert sorted(exported) == sorted(params)
  for key, value in params.items():
    np.testing.assert_array_equal(exported[key].numpy(), value, err_msg=key)
  before = source.vision_language_encoder.state_dict()
  assert any(not torch.equal(exported[k], before[k]) for k in exported)
  for name in OTHERS:
    assert_same_state(getattr(pipe, name), getattr(source, name), name)
  for name in COPIED:
    a, b = hf_dir / name, out / name
    if a.is_dir():
      cmp = filecmp.dircmp(a, b)
      assert not (cmp.left_only or cmp.right_only or cmp.diff_files), name
    else:
      assert filecmp.cmp(a, b, shallow=False), name
  for name in ("config.json", "generation_config.json"):
    assert filecmp.cmp(hf_dir / AR / name, out / AR / name, shallow=False), name


def test_random_preset_run_writes_the_generator_and_says_why_no_more(trained, tmp_path, capsys):
  workdir, _ = trained
  preset = tmp_path / "preset"
  shutil.copytree(workdir, preset)
  with open(preset / "checkpoints" / "source.json", "w") as f:
    json.dump({"checkpoint_dir": ""}, f)  # what a run without config.model.checkpoint_dir records
  out = tmp_path / "exported"
  result = flax_to_hf.export(str(preset), str(out))
  printed = capsys.readouterr().out
  assert result["complete"] is False
  assert "random preset" in result["incomplete_reason"]
  assert f"warning: {out} is not a complete pipeline folder" in printed and "random preset" in printed
  assert sorted(os.listdir(out)) == [AR]


def test_converted_folder_exports_a_complete_pipeline(tiny_released, tmp_path):
  hf_dir, converted = tiny_released
  out = tmp_path / "exported"
  result = flax_to_hf.export(str(converted), str(out), log=lambda _: None)
  assert result["complete"] is True and result["incomplete_reason"] is None
  pipe, source = load(out), load(hf_dir)
  for name in (AR, *OTHERS):
    assert_same_state(getattr(pipe, name), getattr(source, name), name)
  generation = pipe.vision_language_encoder.generation_config
  assert (generation.temperature, generation.top_p) == (released_folder.TEMPERATURE, released_folder.TOP_P)
