"""HF CLIPModel folders -> converted folders through checkpoints_convert, and loading them back.

Layouts: transformers 5's clean model.safetensors, a pre-4.31 one holding the position_ids buffers,
and pytorch_model.bin only. Parameters must come back bit-exact (forward parity of converted folders
is checked end to end by tests/rewards/test_clip_score.py and test_pickscore.py).
"""

import glmrl  # noqa: F401

import os

import numpy as np
import pytest
import safetensors.torch
import torch
from flax import nnx

from checkpoints_convert import flax_to_hf, hf_to_flax
from checkpoints_convert.maps.clip import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from checkpoints_convert import clip as convert_lib
from glmrl.models.clip.checkpoint import load_clip, load_image_processing
from glmrl.models.clip.preprocess import ImageProcessing
from tests.models.clip import tiny

KEYMAP = KeyMap(RULES)


@pytest.fixture(scope="module")
def ref():
  return tiny.reference_model(tiny.config("legacy"))


def assert_same_params(model, state_dict):
  params = {flax_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  assert len(params) == len(state_dict)
  for key, tensor in state_dict.items():
    path, transform = KEYMAP.hf_to_flax(key)
    np.testing.assert_array_equal(np.asarray(params[path][...]), transform.to_flax(tensor.numpy()), err_msg=key)


@pytest.mark.parametrize("layout", ["clean", "legacy", "bin"])
def test_convert_and_load(layout, ref, tmp_path):
  hf = tiny.write_hf_folder(tmp_path / "hf", ref, layout=layout)
  logs = []
  result = convert_lib.convert_clip(str(hf), str(tmp_path / "out"), log=logs.append)
  assert result["tensors"] == len(ref.state_dict())
  assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "params", "preprocessor_config.json",
                                                  "tokenizer.json", "tokenizer_config.json"]
  assert (layout == "clean") == (not any("legacy buffers" in line or "pytorch_model.bin" in line for line in logs))
  model = load_clip(str(tmp_path / "out"))
  assert_same_params(model, ref.state_dict())
  assert load_image_processing(str(tmp_path / "out")) == ImageProcessing.tiny(32)


def test_generic_converter_and_export_round_trip(ref, tmp_path):
  """A clean folder named clip/ also goes through `python -m checkpoints_convert` and back bit-exact."""
  tiny.write_hf_folder(tmp_path / "hf" / "clip", ref)
  result = hf_to_flax.convert_pipeline(str(tmp_path / "hf"), str(tmp_path / "flax"), log=lambda s: None)
  assert list(result["converted"]) == ["clip"]
  flax_to_hf.export(str(tmp_path / "flax"), str(tmp_path / "back"), log=lambda s: None)
  back = safetensors.torch.load_file(str(tmp_path / "back" / "clip" / "model.safetensors"))
  sd = ref.state_dict()
  assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_errors(ref, tmp_path):
  hf = tiny.write_hf_folder(tmp_path / "hf", ref)
  sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
  sd["text_model.extra.weight"] = torch.zeros(2)
  del sd["visual_projection.weight"]
  safetensors.torch.save_file(sd, str(hf / "model.safetensors"))
  with pytest.raises(ValueError, match=r"(?s)missing \(1\): visual_projection.weight.*unexpected \(1\): "
                                       r"text_model.extra.weight"):
    convert_lib.convert_clip(str(hf), str(tmp_path / "out"), log=lambda s: None)
  os.remove(hf / "model.safetensors")
  with pytest.raises(FileNotFoundError, match="neither model.safetensors"):
    convert_lib.convert_clip(str(hf), str(tmp_path / "out"), log=lambda s: None)
  (tmp_path / "out" / "params").mkdir(parents=True)
  with pytest.raises(ValueError, match="already exists"):
    convert_lib.convert_clip(str(hf), str(tmp_path / "out"), log=lambda s: None)
  (hf / "config.json").write_text('{"model_type": "siglip"}')
  assert convert_lib.main(["--hf_dir", str(hf), "--out_dir", str(tmp_path / "o2")]) == 2
  with pytest.raises(ValueError, match="is not a directory"):
    convert_lib.convert_clip(str(tmp_path / "nope"), str(tmp_path / "o3"))
  with pytest.raises(FileNotFoundError, match="no .*config.json"):
    load_clip(str(tmp_path / "nope"))
