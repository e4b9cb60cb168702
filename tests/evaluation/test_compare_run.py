"""Checkpoints compared as users run it: the demo trained two steps through main.py, then `--mode=eval` of a
shipped benchmark's subset at steps 0 (before RL) and 2; the report's intervals recomputed from its own
per-prompt scores by an independent numpy bootstrap over the same resamples (1e-6); bad steps and benchmarks
end in one line before any sampling. main.py's `__main__` runs in the test's process (tests/cli.py); the pod test
(tests/train/test_multihost.py) launches `--mode=eval` as processes."""

import html.parser
import json
import os
import re
import shutil
import subprocess
import warnings

import numpy as np
from PIL import Image

from glmrl.evaluation import stats
from glmrl.evaluation.report import format_ci
from tests.cli import TIMEOUT_S, assert_one_line_error, main_in_process


def test_eval_compares_checkpoints_with_paired_intervals(tmp_path):
  workdir = tmp_path / "run"
  flags = ("--config=configs/demo.py", "--config.train.num_steps=2", "--config.checkpoint.save_interval=2")
  out = main_in_process(*flags, tmp_path=workdir)
  assert out.returncode == 0, out.stderr[-3000:]
  out = main_in_process(*flags, "--mode=eval", "--config.eval.benchmark=parti:4", "--config.eval.steps=0,2",
                        tmp_path=workdir)
  assert out.returncode == 0, out.stderr[-3000:]
  # Orbax's notes on opening the checkpoints read-only ("Given directory is read only", "read_only=True, setting
  # save_interval_steps=0") are not the user's.
  assert "read only" not in out.stderr and "read_only" not in out.stderr, out.stderr
  report = json.loads((workdir / "eval" / "report.json").read_text())
  assert report["steps"] == [0, 2] and report["prompts"] == 4 and report["samples_per_prompt"] == 8
  assert len(report["prompt_text"]) == 4 and sum(v for k, v in report["categories"].items() if k != "overall") == 4
  table = report["rewards"]["reward"]
  rows = stats.resample_indices(4, report["seed"], report["resamples"])
  for step in ("0", "2"):
    values = np.asarray(report["per_prompt"]["reward"][step])
    means = values[rows].mean(axis=1)
    want = [values.mean(), np.percentile(means, 2.5), np.percentile(means, 97.5)]
    got = table["overall"]["mean"][step]
    np.testing.assert_allclose([got["mean"], got["low"], got["high"]], want, atol=1e-6)
  diff = np.asarray(report["per_prompt"]["reward"]["2"]) - np.asarray(report["per_prompt"]["reward"]["0"])
  np.testing.assert_allclose(table["overall"]["difference"]["2"]["mean"], diff.mean(), atol=1e-9)
  # Each checkpoint's scalars, with the interval of its mean, in the run's metrics at its step.
  evals = {r["step"]: r for r in map(json.loads, open(workdir / "metrics.jsonl")) if "eval/reward/ci_low" in r}
  assert sorted(evals) == [0, 2]
  for step, r in evals.items():
    got = table["overall"]["mean"][str(step)]
    np.testing.assert_allclose([r["eval/reward/ci_low"], r["eval/reward/ci_high"]], [got["low"], got["high"]],
                               atol=1e-6)
  text = (workdir / "eval" / "report.md").read_text()
  assert "| overall | 4 |" in text and "step 2 - base (step 0)" in text
  assert sorted(os.listdir(workdir / "eval" / "images" / "2")) == [f"{i}.png" for i in range(4)]
  assert_page_renders(workdir / "eval" / "index.html", images=8)
  # Each image's drift from the base's at the same prompt and seed: 0 for the base itself; step 2's first samples
  # against skimage's SSIM of the page's images (the demo's 64 x 64 images are compared as they are).
  from skimage.metrics import structural_similarity

  for name in ("drift/ssim", "drift/rmse"):
    assert report["per_prompt"][name]["0"] == [0.0] * 4 and max(report["per_prompt"][name]["2"]) > 0.0
  for i in range(4):
    a, b = (np.asarray(Image.open(workdir / "eval" / "images" / s / f"{i}.png")) for s in ("2", "0"))
    want = 1.0 - structural_similarity(a, b, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                       data_range=255, channel_axis=-1)
    np.testing.assert_allclose(report["first_sample"]["drift/ssim"]["2"][i], want, rtol=1e-6, atol=1e-9)
  assert "## drift/ssim" in text
  # The page shows the drift beside the rewards, with what each measure means (1 - SSIM above 1 included).
  page_text = (workdir / "eval" / "index.html").read_text()
  assert "<h2>Drift from base (step 0)</h2>" in page_text and "above 1 (up to 2) where it is anti-correlated" in \
      page_text
  for name in ("drift/ssim", "drift/rmse"):
    overall = report["rewards"][name]["overall"]["mean"]["2"]
    assert f"<tr><td>{name}</td><td>overall</td><td>{format_ci(report['rewards'][name]['overall']['mean']['0'])}" \
           f"</td><td>{format_ci(overall)}</td></tr>" in page_text

  # A repeated eval replaces its rows in metrics.jsonl (one per step), not appends them again.
  again = main_in_process(*flags, "--mode=eval", "--config.eval.benchmark=parti:4", "--config.eval.steps=0,2",
                          tmp_path=workdir)
  assert again.returncode == 0, again.stderr[-3000:]
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["step"] for r in rows if "eval/reward/mean" in r] == [0, 2]
  assert [r["step"] for r in rows if "eval/reward/mean" not in r] == [1, 2]  # the training rows stay

  bad = main_in_process(*flags, "--mode=eval", "--config.eval.benchmark=parti:4", "--config.eval.steps=0,5",
                        tmp_path=workdir)
  assert_one_line_error(bad, "config.eval.steps='0,5': no checkpoint of step 5 in")
  assert "(saved: [1, 2])" in bad.stderr
  bad = main_in_process(*flags, "--mode=eval", "--config.eval.benchmark=drawbench:16", tmp_path=workdir)
  assert_one_line_error(bad, "config.eval.benchmark='drawbench:16': must be '' or a shipped benchmark")


def browser():
  return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class _Images(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.sources = []

  def handle_starttag(self, tag, attrs):
    if tag == "img":
      self.sources.append(dict(attrs)["src"])


def assert_page_renders(path, images: int):
  """Every image the page names exists next to it and decodes (checked here, with or without a browser); then, in
  headless Chromium (Debian's `chromium`; .ci/run installs it), the page's own script records that every image
  decoded, and the DOM Chromium dumps says so."""
  parser = _Images()
  parser.feed(path.read_text())
  assert len(parser.sources) == images
  for source in parser.sources:
    with Image.open(path.parent / source) as im:
      assert im.size[0] > 0
  if browser() is None:
    warnings.warn("no Chromium on this machine (apt-get install chromium): the page was checked but not rendered")
    return
  out = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                        "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
                       capture_output=True, text=True, timeout=TIMEOUT_S)
  assert out.returncode == 0, out.stderr[-2000:]
  body = re.search(r"<body[^>]*>", out.stdout).group(0)
  assert 'data-images-loaded="true"' in body and f'data-image-count="{images}"' in body, body
