"""A checkpoint that cannot be written stops the run in one line, its partial folder removed and the steps
saved before it intact; a folder too small for one checkpoint is refused before the first step. The disk
fills for real: the workdir is a small tmpfs (`small_disk` in tests/conftest.py)."""

import os
import re

from tests.cli import assert_one_line_error, run_main


ARGS = ("--config=configs/demo.py", "--config.log.image_interval=0")


def test_a_folder_too_small_for_one_checkpoint_is_refused_before_any_model(small_disk):
  """Its size from the run's abstract state, before any model is built; the workdir the run made is gone again."""
  work = small_disk("2m") / "run"
  result = run_main(*ARGS, tmp_path=work)
  assert_one_line_error(result, f"error: {work}: ")
  assert "MiB free, a checkpoint takes about" in result.stderr
  assert "loading " not in result.stderr and "step 1/" not in result.stderr  # no model built
  assert not work.exists()


def test_a_full_disk_stops_the_run_and_keeps_the_saved_steps(small_disk):
  # Room for two of the demo's ~2.8 MiB checkpoints: the third save fails in the background.
  work = small_disk("7m") / "run"
  result = run_main(*ARGS, "--config.train.num_steps=6", "--config.checkpoint.save_interval=1",
                    "--config.checkpoint.max_to_keep=10", tmp_path=work)
  assert_one_line_error(result, "saving a checkpoint into", before_any_work=False)  # after two steps' work
  (line,) = [l for l in result.stderr.splitlines() if l.startswith("error: ")]
  # Short (Orbax's own error quotes its internal paths): the folder, the bytes free and needed, the steps kept.
  assert line.startswith(f"error: saving a checkpoint into {work / 'checkpoints'}: disk full (")
  assert re.search(r": disk full \(\d+\.\d MiB free, \d+\.\d MiB needed\); steps \[1, 2\] are intact: free space and "
                   "rerun to resume$", line), line
  assert len(line) - len(str(work / "checkpoints")) < 140, (len(line), line)
  assert "step 6/6" not in result.stderr
  assert result.stderr.count("Traceback") == 0 and len(result.stderr.splitlines()) < 60
  names = os.listdir(work / "checkpoints")
  assert not [n for n in names if "tmp" in n], names
  assert {"1", "2"} <= set(names)
  for step in ("1", "2"):
    assert (work / "checkpoints" / step / "_CHECKPOINT_METADATA").exists()


def test_a_metadata_write_failing_in_the_background_is_reported_once(tmp_path, monkeypatch, caplog, capfd):
  # A disk can fill while Orbax writes a step's JSON metadata in a background thread. The records Orbax logs of
  # it (one per thread, one when the save is waited for) and asyncio's unretrieved future name no folder; CI saw
  # them as tracebacks once. Injected here, deterministically: every text write into step 2 fails with ENOSPC,
  # while its arrays' TensorStore writes succeed after Orbax has given up on the step (they recreated its removed
  # folder in 1 of 3 runs before `_remove_partial` waited for them).
  import errno
  import logging

  import jax
  import jax.numpy as jnp
  import pytest
  from etils.epath import abstract_path

  from glmrl.checkpoint import TrainCheckpointer
  from glmrl.checkpoint.errors import CheckpointSaveError

  write_text = abstract_path.Path.write_text

  def full_disk_in_step_2(path, *args, **kwargs):
    if any(part.split(".")[0] == "2" for part in os.fspath(path).split(os.sep)):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write_text(path, *args, **kwargs)

  monkeypatch.setattr(abstract_path.Path, "write_text", full_disk_in_step_2)
  caplog.set_level(logging.INFO)
  ckpt = TrainCheckpointer(str(tmp_path), save_interval=1, max_to_keep=5)
  items = {"params": {"w": jnp.ones((4, 4))}, "opt_state": {"count": jnp.zeros((), jnp.int32)}}
  ckpt.save(1, items, jax.random.key(0), {"step": 1})
  ckpt.wait()
  with pytest.raises(CheckpointSaveError, match=r"disk full \(.* MiB free, .* MiB needed\); steps \[1\] are intact"):
    ckpt.save(2, items, jax.random.key(0), {"step": 2})  # the failure surfaces here or when waited for
    ckpt.wait()
  logged = [r for r in caplog.records if r.exc_info]
  assert not logged, [r.getMessage() for r in logged]
  assert "Traceback" not in capfd.readouterr().err
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]
