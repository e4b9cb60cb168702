"""--to_hf from a training run: CheckpointManager steps with a `params` item + ar_config.json."""

import os
import shutil
import subprocess
import sys

import glmrl  # noqa: F401
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers
from flax import nnx

from checkpoints_convert import flax_to_hf, hf_to_flax
from checkpoints_convert.components import load_component
from glmrl.checkpoint import params as params_lib
from checkpoints_convert.__main__ import main
from tests.checkpoints_convert import tiny_folders
from tests.cli import ROOT, TIMEOUT_S

AR = "vision_language_encoder"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """workdir/checkpoints/{1,2}/params: step 1 an nnx.State, step 2 a pure dict of 2x the weights."""
  root = tmp_path_factory.mktemp("train")
  model = tiny_folders.reference_model(AR)
  model.save_pretrained(root / "hf" / AR)
  hf_to_flax.convert_pipeline(str(root / "hf"), str(root / "flax"), log=lambda s: None)
  state = nnx.state(load_component(str(root / "flax" / AR)), nnx.Param)
  ckpt_dir = root / "workdir" / "checkpoints"
  with ocp.CheckpointManager(ckpt_dir) as mngr:
    mngr.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(state)))
    doubled = jax.tree.map(lambda x: 2 * x, nnx.to_pure_dict(state))
    mngr.save(2, args=ocp.args.Composite(params=ocp.args.StandardSave(doubled),
                                         extra=ocp.args.JsonSave({"note": "ignored by the export"})))
    mngr.wait_until_finished()
  shutil.copy(root / "hf" / AR / "config.json", ckpt_dir / "ar_config.json")
  return root, model


def _exported_state(directory):
  m = transformers.GlmImageForConditionalGeneration.from_pretrained(directory / AR)
  return m.state_dict()


def test_exports_latest_step_from_workdir(run, tmp_path):
  root, model = run
  result = flax_to_hf.export(str(root / "workdir"), str(tmp_path / "hf"), log=lambda s: None)
  assert result["step"] == 2
  got = _exported_state(tmp_path / "hf")
  assert list(got) == list(model.state_dict())
  for key, value in model.state_dict().items():
    assert torch.equal(got[key], 2 * value), key


def test_exports_given_step_via_cli(run, tmp_path):
  root, model = run
  ckpt = root / "workdir" / "checkpoints"
  assert main(["--to_hf", f"--ckpt_dir={ckpt}", f"--hf_out_dir={tmp_path / 'hf'}", "--step=1"]) == 0
  got = _exported_state(tmp_path / "hf")
  for key, value in model.state_dict().items():
    assert torch.equal(got[key], value), key
  with open(tmp_path / "hf" / AR / "config.json") as f, open(ckpt / "ar_config.json") as g:
    assert f.read() == g.read()
  hf_to_flax.convert_pipeline(str(tmp_path / "hf"), str(tmp_path / "flax"), log=lambda s: None)
  again = params_lib.flatten(nnx.state(load_component(str(tmp_path / "flax" / AR)), nnx.Param))
  first = params_lib.flatten(nnx.state(load_component(str(root / "flax" / AR)), nnx.Param))
  assert set(again) == set(first)
  for path, value in first.items():
    np.testing.assert_array_equal(np.asarray(again[path]), np.asarray(value), err_msg=path)


def test_unknown_step(run, tmp_path):
  root, _ = run
  with pytest.raises(ValueError, match=r"--step 7 .*available steps: \[1, 2\]"):
    flax_to_hf.export(str(root / "workdir"), str(tmp_path / "hf"), step=7, log=lambda s: None)


def test_run_without_source_record_says_the_folder_is_incomplete(run, tmp_path, capsys):
  root, _ = run  # written without source.json, as runs before it was recorded
  result = flax_to_hf.export(str(root / "workdir"), str(tmp_path / "hf"))
  assert result["complete"] is False
  assert "source.json is missing" in result["incomplete_reason"]
  assert "--source_dir=" in result["incomplete_reason"]
  assert "is not a complete pipeline folder" in capsys.readouterr().out


def test_source_dir_of_another_generator(run, tiny_released, tmp_path):
  root, _ = run  # ARConfig.tiny(); the released-layout folder holds the tiny preset's larger vocabulary
  _, converted = tiny_released
  with pytest.raises(ValueError, match=r"describes a different generator than the trained one .*text"):
    flax_to_hf.export(str(root / "workdir"), str(tmp_path / "hf"), source_dir=str(converted), log=lambda s: None)
  assert not (tmp_path / "hf").exists()  # checked before anything is written


def test_source_dir_must_be_a_converted_folder(run, tmp_path, capsys):
  root, _ = run
  assert main(["--to_hf", f"--ckpt_dir={root / 'workdir'}", f"--hf_out_dir={tmp_path / 'hf'}",
               f"--source_dir={tmp_path}"]) == 2
  err = capsys.readouterr().err
  assert f"source checkpoint '{tmp_path}' (--source_dir) is not a converted GLM-Image folder" in err


def test_an_export_follows_a_link_and_never_replaces_what_the_run_wrote(run, tmp_path, capsys):
  """A link as --hf_out_dir: the export lands where it points and the link stays (run as users do, in its own
  process); a link to the run itself is refused as the run is, and --overwrite of a folder inside the run's workdir
  (its samples) is refused in one line with the folder untouched. A new folder inside the run is written."""
  root, model = run
  workdir = root / "workdir"
  older = tmp_path / "older_export"
  older.mkdir()
  (older / "stale.txt").write_text("an older export\n")
  link = tmp_path / "latest"
  link.symlink_to(older, target_is_directory=True)
  done = subprocess.run([sys.executable, "-m", "checkpoints_convert", "--to_hf", f"--ckpt_dir={workdir}",
                         f"--hf_out_dir={link}", "--overwrite"], capture_output=True, text=True, cwd=ROOT,
                        timeout=TIMEOUT_S)
  assert done.returncode == 0, done.stderr
  assert link.is_symlink() and os.readlink(link) == str(older)
  assert not (older / "stale.txt").exists()
  for key, value in model.state_dict().items():
    assert torch.equal(_exported_state(link)[key], 2 * value), key
  assert sorted(os.listdir(tmp_path)) == ["latest", "older_export"]  # no partial or replaced folder beside it

  to_run = tmp_path / "run_link"
  to_run.symlink_to(workdir, target_is_directory=True)
  samples = workdir / "samples"
  samples.mkdir()
  (samples / "step_1.png").write_bytes(b"grid")
  try:
    for out, line in (
        (to_run, f"--hf_out_dir={to_run} (a link to {workdir}) is or holds --ckpt_dir={workdir}, which the export "
                 "reads: choose another folder"),
        (samples, f"--hf_out_dir={samples} is inside the training run's workdir {workdir}: --overwrite would "
                  "replace what the run wrote; export into a new folder"),
        (to_run / "samples", f"--hf_out_dir={to_run / 'samples'} (a link to {samples}) is inside the training "
                             f"run's workdir {workdir}: --overwrite would replace what the run wrote; export into "
                             "a new folder")):
      capsys.readouterr()
      assert main(["--to_hf", f"--ckpt_dir={workdir}", f"--hf_out_dir={out}", "--overwrite"]) == 2
      assert capsys.readouterr().err == f"error: {line}\n"
    assert os.listdir(samples) == ["step_1.png"]
    assert sorted(os.listdir(workdir)) == ["checkpoints", "samples"]
    assert main(["--to_hf", f"--ckpt_dir={workdir}", f"--hf_out_dir={workdir / 'hf'}"]) == 0
    assert (workdir / "hf" / AR / "config.json").is_file()
  finally:
    shutil.rmtree(samples)
    shutil.rmtree(workdir / "hf", ignore_errors=True)
