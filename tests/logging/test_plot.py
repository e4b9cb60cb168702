import json

import glmrl  # noqa: F401
import numpy as np
import pytest
from PIL import Image

from glmrl.logging.plot import plot_metric, read_metric
from glmrl.logging.plot import nice_ticks

from tests.cli import TIMEOUT_S

LINE = np.array([31, 119, 180])


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def test_plot_png_has_size_and_rising_line(tmp_path):
  rows = [{"step": s, "reward/mean": 0.1 + 0.01 * s, "loss": 1.0} for s in range(0, 50, 2)]
  path = _write(tmp_path / "metrics.jsonl", rows)
  out = plot_metric(path, "reward/mean", tmp_path / "plots" / "reward.png", width=500, height=300)
  im = Image.open(out)
  assert im.format == "PNG" and im.size == (500, 300) and im.mode == "RGB"
  a = np.asarray(im).astype(int)
  ys, xs = np.nonzero(np.abs(a - LINE).sum(-1) < 30)
  assert len(xs) > 200
  left, right = ys[xs < xs.min() + 10].mean(), ys[xs > xs.max() - 10].mean()
  assert left > right + 100  # rising values: the line ends higher (smaller row) than it starts
  # Axis labels and tick labels put dark pixels outside the plot area (left and bottom margins).
  assert (a[:, :60].sum(-1) < 200).sum() > 50 and (a[-45:].sum(-1) < 200).sum() > 50


def test_read_metric_skips_nulls_and_keeps_last_value_per_step(tmp_path):
  path = tmp_path / "m.jsonl"
  path.write_text("\n".join([
      json.dumps({"step": 0, "r": 1.0}), json.dumps({"step": 1, "r": None}), "",
      json.dumps({"step": 2, "x": 3.0}), json.dumps({"step": 3, "r": 4.0}),
      json.dumps({"step": 1, "r": 2.0}),  # a resumed run re-logging step 1
      json.dumps({"step": 3, "r": None}),
  ]))
  assert read_metric(path, "r") == ([0.0, 1.0], [1.0, 2.0])


def test_single_point_and_constant_series(tmp_path):
  path = _write(tmp_path / "m.jsonl", [{"step": 5, "r": 0.0}])
  assert Image.open(plot_metric(path, "r", tmp_path / "a.png")).size == (640, 400)
  path = _write(tmp_path / "n.jsonl", [{"step": s, "r": 2.0} for s in range(3)])
  assert Image.open(plot_metric(path, "r", tmp_path / "b.png")).size == (640, 400)


def test_errors(tmp_path):
  path = _write(tmp_path / "m.jsonl", [{"step": 0, "a": 1.0}, {"step": 1, "b": None}])
  with pytest.raises(ValueError, match=r"no finite values for key 'b'; keys present: \['a', 'b', 'step'\]"):
    plot_metric(path, "b", tmp_path / "x.png")
  path.write_text('{"step": 0, "a": 1}\n{"step": \n')
  with pytest.raises(ValueError, match="m.jsonl:2: bad JSON"):
    read_metric(path, "a")
  with pytest.raises(ValueError, match="too small"):
    plot_metric(path, "a", tmp_path / "x.png", width=10, height=10)


def test_the_command_line_answers_each_mistake_in_one_line(tmp_path):
  """As users run it: a misspelt metric (with the close one named), a missing file, a file that is not JSONL and a
  wrong argument count each end in one `error:` line with exit status 2; a good call prints the PNG's path and
  nothing else (no warning from running a module its package imported)."""
  import subprocess
  import sys

  metrics = _write(tmp_path / "metrics.jsonl", [{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.2}])
  (tmp_path / "notes.txt").write_text("a cat\n")

  def plot(*args):
    return subprocess.run([sys.executable, "-m", "glmrl.logging.plot", *map(str, args)], capture_output=True,
                          text=True, timeout=TIMEOUT_S)

  for args, message in (
      ((metrics, "reward/meen", tmp_path / "o.png"), "no finite values for key 'reward/meen' (did you mean "
                                                     "'reward/mean'?)"),
      ((tmp_path / "nosuch.jsonl", "reward/mean", tmp_path / "o.png"), "No such file or directory"),
      ((tmp_path / "notes.txt", "reward/mean", tmp_path / "o.png"), "notes.txt:1: bad JSON"),
      ((metrics,), "expected METRICS_JSONL KEY OUT_PNG, got 1 argument(s)")):
    result = plot(*args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
  result = plot(metrics, "reward/mean", tmp_path / "o.png")
  assert result.returncode == 0 and result.stdout == f"{tmp_path / 'o.png'}\n" and not result.stderr, result.stderr


@pytest.mark.parametrize("lo,hi,want", [
    (0, 48, [0, 10, 20, 30, 40, 50]),
    (0.1, 0.58, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),
    (-3, 7, [-4, -2, 0, 2, 4, 6, 8]),
])
def test_nice_ticks(lo, hi, want):
  np.testing.assert_allclose(nice_ticks(lo, hi), want, atol=1e-12)


def test_series_share_axes_each_in_its_own_colour(tmp_path):
  from glmrl.logging.plot import plot_series
  import numpy as np
  from PIL import Image
  out = plot_series({"a": ([0, 10, 20], [0.1, 0.2, 0.3]), "b": ([0, 5, 30], [0.3, 0.25, 0.2])}, tmp_path / "s.png",
                    xlabel="seconds", ylabel="reward")
  pixels = np.asarray(Image.open(out).convert("RGB")).reshape(-1, 3)
  colours = {tuple(p) for p in pixels}
  assert (31, 119, 180) in colours and (214, 39, 40) in colours
  with pytest.raises(ValueError, match="1 to 6 series"):
    plot_series({}, tmp_path / "e.png", xlabel="x", ylabel="y")
