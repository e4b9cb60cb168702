"""The `hps` reward (HPS v2.1) against open_clip on a tiny random OpenCLIP model saved as HPS releases its
checkpoint (tests/rewards/open_clip_oracle.py, in a process of its own), converted by
`python -m checkpoints_convert.hps` as users run it.

Tolerance: each score within 1e-5 of the reference's, relative (1e-7 absolute for a score near 0); measured
3.3e-6 at most, through a downscale, a downscale with padding on a non-square image, and an upscale.
"""

import json

import glmrl  # noqa: F401

import jax
import numpy as np
import pytest
from flax import nnx

from checkpoints_convert import hps as hps_convert
from glmrl.models.clip import ClipModel
from glmrl.models.init_rngs import InitRngs
from glmrl.models.clip.tokenizer import PromptTokenizer
from glmrl.rewards import RewardComposer
from glmrl.rewards import hps
from tests.models.clip import tiny
from tests.rewards import preference_models
from tests.rewards.open_clip_oracle import PROMPTS, SIZES, TEXT_PROMPTS


@pytest.fixture(scope="module")
def oracle(shared_runs):
  """(the oracle's folder, the converted folder, a tokenizer folder)."""
  out = preference_models.hps(shared_runs)
  return out, out / "converted", out / "tokenizer"


def test_scores_are_open_clips_hps_scores(oracle):
  out, converted, tokenizer = oracle
  composer = RewardComposer([{"name": "hps", "weight": 1.0,
                              "kwargs": {"ckpt_dir": str(converted), "tokenizer_dir": str(tokenizer)}}], group_size=2)
  prepared = composer.prepare(PROMPTS)
  reference = np.load(out / "reference.npz")
  # The prompts tokenized as the oracle laid them out for open_clip (start, tokens, end, zeros).
  ids = reference["ids"]
  assert [list(row[:row.argmax() + 1]) for row in ids] == tiny.tiny_tokenizer()(PROMPTS)["input_ids"]
  score = jax.jit(composer.jax_scores)
  for h, w in SIZES:
    got = np.asarray(score(reference[f"images_{h}x{w}"], prepared)["hps"])
    want = reference[f"scores_{h}x{w}"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"{h}x{w}")
  assert np.ptp(want) > 0.1  # the prompts and images are told apart


def test_the_converted_folder_exports_back_to_the_tensors_it_was_converted_from(oracle, tmp_path):
  """The round trip: the converted folder, exported by the `clip` component (the path `--to_hf` takes), gives back
  bit for bit the CLIPModel tensors `checkpoints_convert.hps` made of the OpenCLIP checkpoint (renamed, in_proj
  split, projections transposed), every one of them."""
  import safetensors.numpy

  from checkpoints_convert import component_export, components
  from checkpoints_convert.clip import COMPONENT
  from glmrl.checkpoint.params import PARAMS_DIR

  out, converted, _ = oracle
  component = components.get(COMPONENT)
  config = json.loads((converted / "config.json").read_text())
  component_export.export_component(component, str(converted / PARAMS_DIR), config, str(tmp_path))
  back = safetensors.numpy.load_file(str(tmp_path / component.weights_name))
  made = hps_convert.openclip_to_clipmodel(hps_convert.read_state_dict(str(out / "hps.pt")))
  assert set(back) == set(made)
  for key, (shape, dtype, read) in made.items():
    np.testing.assert_array_equal(back[key], read(), err_msg=key)
    assert back[key].shape == shape and back[key].dtype == dtype, key


def test_prompts_are_tokenized_as_open_clip_tokenizes_them(oracle):
  """hpsv2 tokenizes with open_clip's own tokenizer; the reward with transformers' CLIP tokenizer on the same
  vocabulary and merges, after OpenCLIP's text cleaning (`hps.open_clip_text`). Every id up to the end token
  equal, on prompts with HTML entities, mojibake, accents, runs of whitespace, capitals, CJK, emoji and more than
  77 tokens; without the cleaning the entities and the mojibake come out otherwise."""
  out, _, _ = oracle
  want = np.load(out / "text_ids.npy")
  ends = [int(np.argmax(row == row.max())) + 1 for row in want]  # the end token has the largest id
  assert max(ends) == 77  # the long prompt is cut, its end token kept
  cleaned = PromptTokenizer.from_pretrained(str(out / "open_clip_tokenizer"), 77, clean=hps.open_clip_text)
  plain = PromptTokenizer.from_pretrained(str(out / "open_clip_tokenizer"), 77)
  ids, mask = cleaned(TEXT_PROMPTS)
  for prompt, got, valid, row, end in zip(TEXT_PROMPTS, ids, mask, want, ends):
    np.testing.assert_array_equal(got[:end], row[:end], err_msg=repr(prompt))
    assert valid.sum() == end, prompt
  differ = [p for p, got, row, end in zip(TEXT_PROMPTS, plain(TEXT_PROMPTS)[0], want, ends)
            if not np.array_equal(got[:end], row[:end])]
  assert differ == ["Tom &amp; Jerry", "&lt;b&gt;bold&lt;/b&gt;", "Ã©cole"]


def _parameters(cfg) -> int:
  abstract = nnx.eval_shape(lambda: ClipModel(cfg, rngs=InitRngs(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def test_parameter_counts_are_open_clips(oracle):
  """The released ViT-H-14 (986,109,441 parameters by open_clip's own count) and the tiny model."""
  out, _, _ = oracle
  counts = json.loads((out / "counts.json").read_text())
  assert counts["ViT-H-14"] == 986_109_441
  assert _parameters(hps_convert.clip_config(hps_convert.VIT_H_14)) == counts["ViT-H-14"]
  assert _parameters(hps_convert.clip_config(json.loads((out / "model_config.json").read_text()))) == counts["tiny"]


def test_bad_checkpoints_and_configs_end_in_one_line(oracle, tmp_path, capsys):
  out, _, _ = oracle
  import torch

  state = torch.load(out / "hps.pt", weights_only=True)["state_dict"]
  config = str(out / "model_config.json")
  cases = {
      "missing.pt": (None, "is not a file (HPS v2.1 is HPS_v2.1_compressed.pt)"),
      "text.pt": ("not a checkpoint", "text.pt: not a torch checkpoint: text"),
      "bias.pt": ({"state_dict": {**state, "logit_bias": torch.zeros(1)}}, "'logit_bias' has no CLIPModel counterpart"),
      "wrapped.pt": ({f"module.{k}": v for k, v in state.items()}, "keys start with 'module.'"),
      "short.pt": ({k: v for k, v in state.items() if k != "ln_final.bias"}, "missing 1 (text_model.final_layer_norm.bias)"),
  }
  for name, (content, message) in cases.items():
    path = tmp_path / name
    if isinstance(content, str):
      path.write_text(content)
    elif content is not None:
      torch.save(content, path)
    code = hps_convert.main([f"--checkpoint={path}", f"--model_config={config}", f"--out_dir={tmp_path / name}.out"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and message in err, (name, err)
  # The released ViT-H-14 layout (the default config) on the tiny weights: their shapes are named.
  code = hps_convert.main([f"--checkpoint={out / 'hps.pt'}", f"--out_dir={tmp_path / 'default'}"])
  err = capsys.readouterr().err
  assert code == 2 and "shapes differ" in err and "model expects" in err and err.count("\n") == 1, err
  assert not (tmp_path / "default").exists()  # refused before anything was written
  with pytest.raises(ValueError, match="ls_init_value=0.1 is not supported"):
    hps_convert.clip_config({**hps_convert.VIT_H_14, "vision_cfg": {**hps_convert.VIT_H_14["vision_cfg"],
                                                                     "ls_init_value": 0.1}})
