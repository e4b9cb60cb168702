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
  assert p.summary(2, "/w/checkpoints") == "done: 2 steps in 0:00:32, reward 0.5 -> 0.75; checkpoints in /w/checkpoints"
  assert p.summary(2, "/w/c", stopped_by="SIGTERM").startswith("stopped by SIGTERM at step 2/10 in 0:00:32")


def test_resumed_run_counts_from_its_start():
  clock = Clock()
  p = Progress(num_steps=10, start_step=8, now=clock)
  clock.t = 5.0
  # Its first step compiles again: the ETA waits for the next one.
  assert p.line(9, {}).startswith("step 9/10 | 0:00:05 elapsed, ETA --")
