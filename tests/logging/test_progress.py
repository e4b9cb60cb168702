"""The console progress line and the closing summary."""

from glmrl.logging.progress import Progress


class Clock:
  def __init__(self):
    self.t = 0.0

  def __call__(self):
    return self.t


def test_line_shows_step_eta_and_the_watched_metrics():
  clock = Clock()
  p = Progress(num_steps=10, start_step=0, now=clock)
  clock.t = 30.0  # the first step compiles
  first = p.line(1, {"reward/mean": 0.5, "loss": 0.01, "kl": 0.0, "ratio/min": 1.0, "ratio/max": 1.0,
                     "time/step": 30.0, "grad_norm": 2.0, "clip/low_frac": 0.0})
  # The first step compiles: no ETA from it (30 s x 9 would be ~15x the steady-state estimate).
  assert first.startswith("step 1/10 | 0:00:30 elapsed, ETA -- | reward 0.5 | loss 0.01 | kl 0 | grad 2")
  assert "ratio [1.0000, 1.0000]" in first and "30.00 s/step" in first and "clip" not in first
  clock.t = 32.0  # later steps take 2 s: the ETA follows them, not the compiling first step
  second = p.line(2, {"reward/mean": 0.75, "loss": float("nan"), "skipped": 1.0})
  assert "ETA 0:00:16" in second and "loss" not in second and "SKIPPED" in second
  where = {"checkpoints": "/w/checkpoints", "metrics": "/w/metrics.jsonl"}
  assert p.summary(2, where) == ("done: 2 steps in 0:00:32, reward 0.5 -> 0.75; checkpoints in /w/checkpoints; "
                                 "metrics in /w/metrics.jsonl")
  assert p.summary(2, where, stopped_by="SIGTERM").startswith("stopped by SIGTERM at step 2/10 after 2 steps in 0:00:32")


def test_resumed_run_counts_from_its_start():
  clock = Clock()
  p = Progress(num_steps=10, start_step=8, now=clock)
  clock.t = 5.0
  # Its first step compiles again: the ETA waits for the next one.
  assert p.line(9, {}).startswith("step 9/10 | 0:00:05 elapsed, ETA --")


def test_a_resumed_runs_summary_counts_and_scores_its_own_steps():
  clock = Clock()
  p = Progress(num_steps=12, start_step=5, now=clock)
  for step, reward in ((6, 0.25), (7, 0.5), (12, 0.75)):
    clock.t += 1.0
    p.line(step, {"reward/mean": reward})
  assert p.summary(12, {"checkpoints": "/w/c"}) == "done: 7 steps (6-12) in 0:00:03, reward 0.25 -> 0.75; checkpoints in /w/c"
