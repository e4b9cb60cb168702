"""A checkpoint that cannot be written stops the run in one line, its partial folder removed and the steps
saved before it intact; a folder too small for one checkpoint is refused before the first step. The disk
fills for real: the workdir is a small tmpfs (`small_disk` in tests/conftest.py)."""

import os

from tests.test_main import assert_one_line_error, run_main


ARGS = ("--config=configs/demo.py", "--config.log.image_interval=0")


def test_a_folder_too_small_for_one_checkpoint_is_refused_before_training(small_disk):
  work = small_disk("2m") / "run"
  result = run_main(*ARGS, tmp_path=work, timeout=300)
  assert_one_line_error(result, "MiB free, a checkpoint takes about")
  assert "step 1/" not in result.stderr


def test_a_full_disk_stops_the_run_and_keeps_the_saved_steps(small_disk):
  # Room for two of the demo's ~2.8 MiB checkpoints: the third save fails in the background.
  work = small_disk("7m") / "run"
  result = run_main(*ARGS, "--config.train.num_steps=6", "--config.checkpoint.save_interval=1",
                    "--config.checkpoint.max_to_keep=10", tmp_path=work, timeout=300)
  assert_one_line_error(result, "saving a checkpoint into", within=None)  # after two steps' work
  assert "no space left on device" in result.stderr and "step 6/6" not in result.stderr
  assert result.stderr.count("Traceback") == 0 and len(result.stderr.splitlines()) < 60
  names = os.listdir(work / "checkpoints")
  assert not [n for n in names if "tmp" in n], names
  assert {"1", "2"} <= set(names)
  for step in ("1", "2"):
    assert (work / "checkpoints" / step / "_CHECKPOINT_METADATA").exists()
