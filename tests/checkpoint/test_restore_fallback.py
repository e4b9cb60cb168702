"""A damaged latest training checkpoint: the run resumes from the newest step that restores."""

import hashlib
import logging
import os
import shutil

import glmrl  # noqa: F401
import pytest

from glmrl.checkpoint import CheckpointError
from glmrl.train import loop
from tests.train.common import tiny_config


def config():
  # Two steps, both saved: the older one is the fallback.
  return tiny_config(train__num_steps=2, checkpoint__save_interval=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A workdir holding checkpoint steps 1 and 2."""
  workdir = tmp_path_factory.mktemp("run") / "workdir"
  trainer = loop.Trainer(config(), str(workdir))
  try:
    for _ in range(2):
      trainer.step()
      trainer.save(force=True)
  finally:
    trainer.close()
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1", "2", "ar_config.json", "source.json"]
  return workdir


def files(root):
  """{relative path: sha256} of every file under `root`."""
  out = {}
  for d, _, names in os.walk(root):
    for n in names:
      p = os.path.join(d, n)
      with open(p, "rb") as f:
        out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
  return out


def truncate_largest_params_file(step_dir):
  sizes = [(os.path.getsize(os.path.join(d, n)), os.path.join(d, n))
           for d, _, names in os.walk(step_dir / "params") for n in names]
  _, path = max(sizes)
  with open(path, "r+b") as f:
    f.truncate(100)


def delete_params_metadata(step_dir):
  os.remove(step_dir / "params" / "_METADATA")


@pytest.mark.parametrize("corrupt", [truncate_largest_params_file, delete_params_metadata])
def test_falls_back_to_older_step_and_keeps_the_bad_one(trained, tmp_path, caplog, corrupt):
  workdir = tmp_path / "workdir"
  shutil.copytree(trained, workdir)
  ckpts = workdir / "checkpoints"
  corrupt(ckpts / "2")
  before = files(ckpts / "2")
  with caplog.at_level(logging.WARNING):
    trainer = loop.Trainer(config(), str(workdir))
  try:
    assert trainer.step_index == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"checkpoint step 2 at {ckpts / '2'} does not restore: " in w for w in warnings), warnings
    if corrupt is delete_params_metadata:
      assert any("params/_METADATA missing" in w for w in warnings), warnings
    else:
      assert any("OUT_OF_RANGE" in w for w in warnings), warnings
    # Nothing deleted: the unreadable step is kept byte for byte, out of Orbax's way.
    assert files(ckpts / "unreadable" / "2") == before
    assert not (ckpts / "2").exists()
    assert files(ckpts / "1") == files(trained / "checkpoints" / "1")
    if corrupt is truncate_largest_params_file:
      # The redone step saves again (Orbax refuses a step number that exists or is older than the latest).
      trainer.step()
      assert trainer.save(force=True)
      trainer.checkpointer.wait()
      assert sorted(os.listdir(ckpts)) == ["1", "2", "ar_config.json", "source.json", "unreadable"]
  finally:
    trainer.close()


def test_no_step_restores(trained, tmp_path):
  workdir = tmp_path / "workdir"
  shutil.copytree(trained, workdir)
  ckpts = workdir / "checkpoints"
  for step in ("1", "2"):
    delete_params_metadata(ckpts / step)
  before = files(ckpts)
  with pytest.raises(CheckpointError) as e:
    loop.Trainer(config(), str(workdir))
  message = str(e.value)
  assert "\n" not in message
  assert f"no checkpoint in {ckpts} restores" in message
  assert "step 2: params/_METADATA missing" in message and "step 1: params/_METADATA missing" in message
  assert isinstance(e.value, ValueError)
  assert files(ckpts) == before  # nothing moved when no step restores


def test_generate_reads_the_newest_step_that_restores_and_changes_nothing(trained, tmp_path, caplog):
  """--mode=generate's parameter restore: falls back too, read-only (nothing is moved)."""
  from glmrl.checkpoint import manager as checkpoint_manager
  from glmrl.train import setup

  workdir = tmp_path / "workdir"
  shutil.copytree(trained, workdir)
  truncate_largest_params_file(workdir / "checkpoints" / "2")
  before = files(workdir)
  run = setup.build(config())
  like = run.states["ar"].checkpoint_params()
  with caplog.at_level(logging.WARNING):
    params, step = checkpoint_manager.restore_trained_params(str(workdir), {"params": like})
  assert step == 1 and params["params"] is not None
  assert any("checkpoint step 2" in r.getMessage() and "does not restore" in r.getMessage() for r in caplog.records)
  assert files(workdir) == before
  truncate_largest_params_file(workdir / "checkpoints" / "1")
  with pytest.raises(CheckpointError, match=r"no checkpoint in .* restores: step 2: .*; step 1: "):
    checkpoint_manager.restore_trained_params(str(workdir), {"params": like})
