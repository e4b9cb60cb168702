import glob
import json
import logging as py_logging
import os

import glmrl  # noqa: F401
import jax.numpy as jnp
import numpy as np
import pytest
from absl import logging
from PIL import Image
from glmrl.logging import MetricsWriter, make_grid, sample_captions
from tests.logging.tfrecords import read_events


def _tb_events(workdir):
  """The event protos of the run's event files (TensorBoard's own reader: every record's checksums verified)."""
  return [e for path in glob.glob(os.path.join(workdir, "events.out.tfevents.*")) for e in read_events(path)]


@pytest.fixture
def info_logs(caplog):
  old = logging.get_verbosity()
  logging.set_verbosity(logging.DEBUG)
  caplog.set_level(py_logging.DEBUG, logger="absl")
  yield caplog
  logging.set_verbosity(old)


def test_scalars_round_trip_jsonl_tensorboard_and_console(tmp_path, info_logs):
  with MetricsWriter(tmp_path) as w:
    row = w.write_scalars(0, {"reward/mean": np.float32(0.25), "loss": jnp.asarray(1.5), "n": 3})
    w.write_scalars(1, {"reward/mean": 0.5, "loss": float("nan"), "kl": float("inf"), "ok": True})
  assert row == {"step": 0, "loss": 1.5, "n": 3.0, "reward/mean": 0.25}
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  rows = [json.loads(line) for line in lines]
  assert rows == [{"step": 0, "loss": 1.5, "n": 3.0, "reward/mean": 0.25},
                  {"step": 1, "kl": None, "loss": None, "ok": 1.0, "reward/mean": 0.5}]
  assert "NaN" not in lines[1] and "Infinity" not in lines[1]
  assert all(isinstance(v, float) for r in rows for k, v in r.items() if k != "step" and v is not None)

  scalars = {(v.tag, e.step): v.simple_value for e in _tb_events(str(tmp_path)) for v in e.summary.value}
  assert scalars == {("reward/mean", 0): 0.25, ("loss", 0): 1.5, ("n", 0): 3.0,
                     ("reward/mean", 1): 0.5, ("ok", 1): 1.0}

  messages = [r.getMessage() for r in info_logs.records if r.name == "absl"]
  assert "step 0 | loss 1.5 | n 3 | reward/mean 0.25" in messages
  assert "step 1 | kl inf | loss nan | ok 1 | reward/mean 0.5" in messages


def test_appends_across_writers(tmp_path):
  with MetricsWriter(tmp_path, tensorboard=False) as w:
    w.write_scalars(0, {"a": 1.0})
  with MetricsWriter(tmp_path, tensorboard=False) as w:
    w.write_scalars(1, {"a": 2.0})
  assert [json.loads(x)["a"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1.0, 2.0]
  assert not glob.glob(str(tmp_path / "events.out.tfevents.*"))


def test_samples_grid_png_and_tensorboard_image(tmp_path):
  images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
  prompts = ["a red cube", "a blue ball", "a cat", "a dog"]
  rewards = np.array([0.5, -1.25, 3.0, 0.0], np.float32)
  with MetricsWriter(tmp_path) as w:
    path = w.write_samples(7, images, prompts, rewards, tag="eval/samples", ncols=2)
  assert path == str(tmp_path / "samples" / "eval_samples_00000007.png")
  want = make_grid(images, sample_captions(prompts, rewards), 2)
  np.testing.assert_array_equal(np.asarray(Image.open(path)), want)
  assert sample_captions(prompts, rewards)[1] == "-1.25 | a blue ball"
  tb_images = [(v.tag, e.step, v.image) for e in _tb_events(str(tmp_path)) for v in e.summary.value
               if v.HasField("image")]
  assert len(tb_images) == 1 and tb_images[0][:2] == ("eval/samples", 7)
  assert (tb_images[0][2].height, tb_images[0][2].width) == want.shape[:2]


@pytest.mark.parametrize("step,scalars,match", [
    (-1, {"a": 1.0}, "step=-1"),
    (1.5, {"a": 1.0}, "step=1.5"),
    (0, {"step": 1.0}, "other than 'step'"),
    (0, {"a": np.zeros(3)}, "metric 'a': value must be a real scalar"),
    (0, {"a": "high"}, "metric 'a': value must be a real scalar"),
])
def test_scalar_errors(tmp_path, step, scalars, match):
  with MetricsWriter(tmp_path, tensorboard=False) as w:
    with pytest.raises(ValueError, match=match):
      w.write_scalars(step, scalars)
  assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_caption_count_mismatch():
  with pytest.raises(ValueError, match="got 2 prompts for 3 rewards"):
    sample_captions(["a", "b"], [1.0, 2.0, 3.0])


def test_drop_rows_after_a_resumed_step(tmp_path):
  with MetricsWriter(tmp_path, tensorboard=False) as w:
    for step in (1, 2, 3, 4):
      w.write_scalars(step, {"a": float(step)})
  with MetricsWriter(tmp_path, tensorboard=False) as w:
    assert w.drop_rows_after(2) == 2
    w.write_scalars(3, {"a": 30.0})
  rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert rows == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}, {"step": 3, "a": 30.0}]
  assert not (tmp_path / "metrics.jsonl.tmp").exists()
