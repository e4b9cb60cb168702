"""The comparison's statistics against an independent numpy bootstrap over the same resamples (1e-6), its
pairing, and its report's tables."""

import numpy as np

from glmrl.evaluation import report, stats


def numpy_bootstrap(values, rows, level=0.95):
  """Written out: the mean of each resample, then the two percentiles (numpy's default linear interpolation)."""
  means = np.array([np.mean([values[i] for i in row]) for row in rows])
  return np.mean(values), np.percentile(means, 100 * (1 - level) / 2), np.percentile(means, 100 * (1 + level) / 2)


def test_mean_ci_is_the_percentile_bootstrap_over_prompts():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(12, 4))
  rows = stats.resample_indices(12, seed=7, resamples=500)
  assert rows.shape == (500, 12) and rows.min() >= 0 and rows.max() < 12
  np.testing.assert_array_equal(rows, np.random.default_rng(7).integers(0, 12, size=(500, 12)))
  got = stats.mean_ci(stats.per_prompt(scores), rows)
  want = numpy_bootstrap(scores.mean(axis=1), rows)
  np.testing.assert_allclose([got["mean"], got["low"], got["high"]], want, atol=1e-6)
  assert got["n"] == 12 and got["low"] < got["mean"] < got["high"]


def test_paired_difference_sees_a_shift_that_unpaired_intervals_hide():
  """Prompts differ a lot, the checkpoint moves each by +0.05: the per-prompt differences' interval excludes 0
  although the two means' intervals overlap."""
  rng = np.random.default_rng(1)
  base = rng.normal(size=(40, 2)) * 2.0
  later = base + 0.05 + rng.normal(size=(40, 2)) * 0.01
  rows = stats.resample_indices(40, seed=3)
  d = stats.paired_difference(stats.per_prompt(later), stats.per_prompt(base), rows)
  assert d["excludes_zero"] and d["low"] > 0
  np.testing.assert_allclose([d["mean"], d["low"], d["high"]],
                             numpy_bootstrap(later.mean(1) - base.mean(1), rows), atol=1e-6)
  a, b = stats.mean_ci(stats.per_prompt(base), rows), stats.mean_ci(stats.per_prompt(later), rows)
  assert a["high"] > b["low"]  # overlapping
  one = stats.paired_difference(np.array([0.3]), np.array([0.1]), stats.resample_indices(1, seed=0))
  assert one["low"] is None and not one["excludes_zero"] and np.isclose(one["mean"], 0.2)
  same = stats.paired_difference(stats.per_prompt(base), stats.per_prompt(base), rows)
  assert same["mean"] == same["low"] == same["high"] == 0.0 and not same["excludes_zero"]


def test_report_groups_by_category_with_shared_resamples_and_marks_differences():
  rng = np.random.default_rng(2)
  categories = ["b", "a", "b", "a", "b", "a", "b", "a"]
  base = {"reward": rng.normal(size=(8, 3)), "reward/x": rng.normal(size=(8, 3))}
  later = {k: v + 1.0 for k, v in base.items()}
  out = report.compare({0: base, 5: later}, categories, seed=11, resamples=300)
  assert out["steps"] == [0, 5] and out["categories"] == {"overall": 8, "a": 4, "b": 4}
  row = out["rewards"]["reward"]["a"]
  members = np.flatnonzero(np.array(categories) == "a")
  rows = stats.resample_indices(4, seed=11 + 1, resamples=300)  # "a" is the second group
  want = numpy_bootstrap(base["reward"].mean(1)[members], rows)
  np.testing.assert_allclose([row["mean"]["0"][k] for k in ("mean", "low", "high")], want, atol=1e-6)
  np.testing.assert_allclose(row["difference"]["5"]["mean"], 1.0, atol=1e-12)
  text = report.markdown(out, "test")
  assert "## reward/x" in text and "| overall | 8 |" in text and "step 5 - base (step 0)" in text
  assert "+1.0000 [+1.0000, +1.0000] *" in text


def test_page_escapes_prompts_and_links_each_checkpoints_image():
  from glmrl.evaluation import page
  scores = {0: {"reward": np.array([[0.1, 0.2], [0.3, 0.4]])}, 7: {"reward": np.array([[0.5, 0.6], [0.7, 0.8]])}}
  out = report.compare(scores, ["x", "y"], seed=0, resamples=50, prompts=["<script>alert(1)</script>", "a & b"])
  text = page.html(out, "t <1>")
  assert "<script>alert(1)</script>" not in text and "&lt;script&gt;" in text and "a &amp; b" in text
  assert 'src="images/7/1.png"' in text and "reward 0.7000<br>prompt mean 0.7500" in text
