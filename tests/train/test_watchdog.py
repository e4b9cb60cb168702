"""The run's no-learning warnings (glmrl.train.watchdog)."""

from glmrl.train.watchdog import Watchdog


def test_streaks_warn_at_the_patience_and_reset():
  dog = Watchdog(("ar/", "decoder/"), patience=3)
  flat = {"ar/reward/zero_variance_group_frac": 1.0, "ar/grad_norm": 0.0, "ar/policy/entropy": 2.0,
          "decoder/reward/zero_variance_group_frac": 0.5, "decoder/grad_norm": 0.1}
  warned = []
  for step in range(1, 7):
    metrics, warnings = dog.update(step, flat)
    warned.append(warnings)
  assert metrics["watchdog/ar/no_signal_steps"] == 6 and metrics["watchdog/ar/zero_grad_steps"] == 6
  assert metrics["watchdog/ar/entropy_collapse_steps"] == 0 and metrics["watchdog/decoder/no_signal_steps"] == 0
  assert [len(w) for w in warned] == [0, 0, 2, 0, 0, 2]
  assert "ar/no_signal: every group's rewards are equal" in warned[2][0] and "(step 3)" in warned[2][0]
  metrics, warnings = dog.update(7, {**flat, "ar/grad_norm": 1e-3, "ar/reward/zero_variance_group_frac": 0.25})
  assert metrics["watchdog/ar/zero_grad_steps"] == 0 and metrics["watchdog/ar/no_signal_steps"] == 0 and not warnings


def test_entropy_collapse_and_missing_metrics():
  dog = Watchdog(("",), patience=2)
  assert dog.update(1, {}) == ({}, [])
  dog.update(1, {"policy/entropy": 0.0})
  _, warnings = dog.update(2, {"policy/entropy": 0.0, "grad_norm": float("nan")})
  assert len(warnings) == 1 and warnings[0].startswith("policy entropy_collapse: the sampling entropy has collapsed")
