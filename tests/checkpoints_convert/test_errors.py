"""Bad inputs: missing / unexpected / mis-shaped keys in both directions, tied keys, CLI misuse."""

import json
import os
import shutil

import glmrl  # noqa: F401
import numpy as np
import pytest
import safetensors.torch
import torch
from flax import nnx

from checkpoints_convert import components, flax_to_hf, hf_to_flax
from checkpoints_convert.components import load_component
from glmrl.checkpoint import params as params_lib
from checkpoints_convert.__main__ import main
from tests.checkpoints_convert import tiny_folders

VAE_WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def vae(tmp_path_factory):
  """A tiny single-file vae/ folder, its state dict, and its conversion."""
  root = tmp_path_factory.mktemp("vae")
  model = tiny_folders.reference_model("vae")
  model.save_pretrained(root / "hf" / "vae")
  hf_to_flax.convert_pipeline(str(root / "hf"), str(root / "flax"), log=lambda s: None)
  flat = {k: np.asarray(v) for k, v in params_lib.flatten(nnx.state(load_component(str(root / "flax" / "vae")), nnx.Param)).items()}
  return root, model.state_dict(), flat


def _hf_variant(tmp_path, vae, edit):
  """hf/vae/ with the state dict changed by `edit(dict)`, same config."""
  root, state, _ = vae
  sd = dict(state)
  edit(sd)
  d = tmp_path / "hf" / "vae"
  d.mkdir(parents=True)
  shutil.copy(root / "hf" / "vae" / "config.json", d)
  safetensors.torch.save_file(sd, str(d / VAE_WEIGHTS), metadata={"format": "pt"})
  return tmp_path / "hf"


def _convert_fails(tmp_path, hf, *patterns):
  with pytest.raises(ValueError) as e:
    hf_to_flax.convert_pipeline(str(hf), str(tmp_path / "out"), log=lambda s: None)
  for p in patterns:
    assert p in str(e.value), (p, str(e.value))
  assert not os.path.exists(tmp_path / "out" / "vae" / "params"), "wrote before validating"
  return str(e.value)


def test_missing_hf_key(tmp_path, vae):
  hf = _hf_variant(tmp_path, vae, lambda sd: sd.pop("decoder.conv_out.bias"))
  msg = _convert_fails(tmp_path, hf, "missing (1)", "decoder.conv_out.bias", "decoder.conv_out.bias (for ")
  assert VAE_WEIGHTS in msg  # names the file


def test_unexpected_hf_key(tmp_path, vae):
  hf = _hf_variant(tmp_path, vae, lambda sd: sd.update({"decoder.extra.weight": torch.zeros(3)}))
  _convert_fails(tmp_path, hf, "unexpected (1)", "decoder.extra.weight")


def test_mis_shaped_hf_key(tmp_path, vae):
  key = "encoder.conv_in.weight"
  shape = list(vae[1][key].shape)
  bad = [shape[0] + 1] + shape[1:]
  hf = _hf_variant(tmp_path, vae, lambda sd: sd.update({key: torch.zeros(bad)}))
  _convert_fails(tmp_path, hf, "shape mismatch (1)", key, str(bad), str(tuple(shape[2:] + shape[1:2] + shape[:1])))


def _orbax_variant(tmp_path, vae, edit):
  """A converted-layout folder whose vae/params hold `edit(flat)`."""
  root, _, flat = vae
  flat = dict(flat)
  edit(flat)
  d = tmp_path / "ckpt" / "vae"
  d.mkdir(parents=True)
  shutil.copy(root / "flax" / "vae" / "config.json", d)
  hf_to_flax.save_params(str(d / "params"), flat)
  return tmp_path / "ckpt"


@pytest.mark.parametrize("edit, patterns", [
    (lambda f: f.pop("decoder.conv_out.bias"), ["missing (1)", "decoder.conv_out.bias"]),
    (lambda f: f.update({"decoder.extra": np.zeros(3, np.float32)}), ["unexpected (1)", "decoder.extra"]),
    (lambda f: f.update({"decoder.conv_out.bias": np.zeros(5, np.float32)}),
     ["shape mismatch (1)", "decoder.conv_out.bias", "[5]"]),
], ids=["missing", "unexpected", "mis-shaped"])
def test_bad_orbax_params(tmp_path, vae, edit, patterns):
  ckpt = _orbax_variant(tmp_path, vae, edit)
  for call in (lambda: flax_to_hf.export(str(ckpt), str(tmp_path / "back"), log=lambda s: None),
               lambda: load_component(str(ckpt / "vae"))):
    with pytest.raises(ValueError) as e:
      call()
    for p in patterns:
      assert p in str(e.value), (p, str(e.value))
    assert str(ckpt / "vae" / "params") in str(e.value)
  assert not os.path.exists(tmp_path / "back" / "vae" / VAE_WEIGHTS)


def test_tied_keys(tmp_path):
  """T5's shared / encoder.embed_tokens: both may be stored, must agree, export writes the first rule's."""
  model = tiny_folders.reference_model("text_encoder")
  sd = {k: v.clone() for k, v in model.state_dict().items()}
  assert {"shared.weight", "encoder.embed_tokens.weight"} <= set(sd)
  for case in ("equal", "differ"):
    d = tmp_path / case / "hf" / "text_encoder"
    d.mkdir(parents=True)
    model.config.to_json_file(str(d / "config.json"))
    if case == "differ":
      sd["encoder.embed_tokens.weight"] = sd["encoder.embed_tokens.weight"] + 1
    safetensors.torch.save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    if case == "equal":
      hf_to_flax.convert_pipeline(str(tmp_path / case / "hf"), str(tmp_path / case / "flax"), log=lambda s: None)
      flax_to_hf.export(str(tmp_path / case / "flax"), str(tmp_path / case / "back"), log=lambda s: None)
      back = safetensors.torch.load_file(str(tmp_path / case / "back" / "text_encoder" / "model.safetensors"))
      assert set(back) == set(sd) - {"encoder.embed_tokens.weight"}
      assert all(torch.equal(back[k], sd[k]) for k in back)
    else:
      with pytest.raises(ValueError, match="both map to embed.embedding but differ"):
        hf_to_flax.convert_pipeline(str(tmp_path / case / "hf"), str(tmp_path / case / "flax"), log=lambda s: None)


def test_skips_absent_components_and_refuses_to_overwrite(tmp_path, vae):
  root = vae[0]
  logs = []
  out = tmp_path / "out"
  result = hf_to_flax.convert_pipeline(str(root / "hf"), str(out), log=logs.append)
  assert list(result["converted"]) == ["vae"]
  assert sorted(result["skipped"]) == sorted(set(components.COMPONENTS) - {"vae"})
  assert any(line.startswith("skipped transformer") for line in logs)
  with pytest.raises(ValueError, match="already exists"):
    hf_to_flax.convert_pipeline(str(root / "hf"), str(out), log=lambda s: None)
  (tmp_path / "back" / "vae").mkdir(parents=True)
  (tmp_path / "back" / "vae" / "stale.txt").write_text("x")
  with pytest.raises(ValueError, match="not empty"):
    flax_to_hf.export(str(out), str(tmp_path / "back"), log=lambda s: None)


def test_model_index_class_mismatch(tmp_path, vae):
  hf = tmp_path / "hf"
  shutil.copytree(vae[0] / "hf", hf)
  (hf / "model_index.json").write_text(json.dumps({"vae": ["diffusers", "AutoencoderTiny"]}))
  with pytest.raises(ValueError, match="AutoencoderTiny"):
    hf_to_flax.convert_pipeline(str(hf), str(tmp_path / "out"), log=lambda s: None)


def test_cli_usage(tmp_path, capsys):
  for argv in (["--hf_dir=a"], ["--to_hf", "--ckpt_dir=a"], ["--to_hf", "--hf_dir=a", "--ckpt_dir=b", "--hf_out_dir=c"],
               ["--hf_dir=a", "--out_dir=b", "--step=3"]):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
      main(argv)
    assert e.value.code == 2, argv
    err = capsys.readouterr().err  # one line, as every bad input (glmrl.errors.ArgumentParser), not a usage block
    assert err.startswith("error: ") and err.endswith("(python -m checkpoints_convert --help)\n"), err
    assert err.count("\n") == 1, err
  assert main([f"--hf_dir={tmp_path / 'nope'}", f"--out_dir={tmp_path / 'out'}"]) == 2
  assert "nope" in capsys.readouterr().err
  assert main(["--to_hf", f"--ckpt_dir={tmp_path}", f"--hf_out_dir={tmp_path / 'o'}", "--max_shard_size=5 apples"]) == 2
  assert "5 apples" in capsys.readouterr().err


def _export_cli(ckpt, out, *extra):
  return main(["--to_hf", f"--ckpt_dir={ckpt}", f"--hf_out_dir={out}", *extra])


def test_an_export_never_writes_into_a_folder_that_holds_something_unless_told(tmp_path, vae, capsys):
  """A non-empty --hf_out_dir (a run's workdir, an older export) is refused in one line and left as it was;
  --overwrite replaces it whole once the new folder is complete; a folder that is or holds what is read, always."""
  converted = vae[0] / "flax"
  out = tmp_path / "workdir"
  out.mkdir()
  (out / "metrics.jsonl").write_text("{}\n")
  capsys.readouterr()
  assert _export_cli(converted, out) == 2
  assert capsys.readouterr().err == (f"error: --hf_out_dir={out} is not empty (1 entries, e.g. 'metrics.jsonl'): "
                                     "choose a new or empty folder, or pass --overwrite to replace it\n")
  assert os.listdir(out) == ["metrics.jsonl"]
  assert _export_cli(converted, out, "--overwrite") == 0
  assert os.listdir(out) == ["vae"] and (out / "vae" / VAE_WEIGHTS).is_file()
  assert not (out / "metrics.jsonl").exists()
  assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no partial folder left
  capsys.readouterr()
  for holder in (converted, converted.parent):
    assert _export_cli(converted, holder, "--overwrite") == 2
    assert capsys.readouterr().err == (f"error: --hf_out_dir={holder} is or holds --ckpt_dir={converted}, which the "
                                       "export reads: choose another folder\n")
  assert (converted / "vae" / "params").is_dir()


def test_a_failed_export_leaves_nothing_and_a_full_disk_names_the_folder(tmp_path, vae, small_disk, monkeypatch):
  converted = vae[0] / "flax"
  disk = small_disk("64k")
  out = disk / "export"
  with pytest.raises(ValueError) as e:
    flax_to_hf.export(str(converted), str(out), log=lambda s: None)
  assert str(e.value).startswith(f"--hf_out_dir={out}: its disk filled after ")
  assert "MiB were free; it needs more): free space there or choose another folder (nothing was left behind)" in \
      str(e.value)
  assert os.listdir(disk) == []
  # Any other failure midway (here the weights' writer) leaves nothing either, and the retry then succeeds.
  real = flax_to_hf.component_export.export_components
  def failing(*args, **kwargs):
    real(*args, **kwargs)
    raise RuntimeError("stopped midway")
  monkeypatch.setattr(flax_to_hf.component_export, "export_components", failing)
  (tmp_path / "elsewhere").mkdir()
  with pytest.raises(RuntimeError, match="stopped midway"):
    flax_to_hf.export(str(converted), str(tmp_path / "elsewhere" / "export"), log=lambda s: None)
  assert os.listdir(tmp_path / "elsewhere") == []
  monkeypatch.setattr(flax_to_hf.component_export, "export_components", real)
  logs = []
  result = flax_to_hf.export(str(converted), str(tmp_path / "elsewhere" / "export"), log=logs.append)
  assert (tmp_path / "elsewhere" / "export" / "vae" / VAE_WEIGHTS).is_file()
  assert all(".partial-" not in line for line in logs) and all(".partial-" not in str(v) for v in result.values())


def test_a_replacement_that_fails_midway_puts_the_older_export_back(tmp_path, vae, monkeypatch):
  """--overwrite sets the older folder aside, renames the new one in, then removes the older: should the second
  rename fail, the older export is back where it was and nothing else is left."""
  converted = vae[0] / "flax"
  out = tmp_path / "export"
  out.mkdir()
  (out / "older.txt").write_text("the older export\n")
  real = os.rename
  def failing(src, dst):
    if ".partial-" in str(src) and not str(src).endswith(".replaced"):
      raise OSError("the rename failed")
    real(src, dst)
  monkeypatch.setattr(flax_to_hf.os, "rename", failing)
  with pytest.raises(OSError, match="the rename failed"):
    flax_to_hf.export(str(converted), str(out), overwrite=True, log=lambda s: None)
  assert sorted(os.listdir(tmp_path)) == ["export"] and os.listdir(out) == ["older.txt"]
