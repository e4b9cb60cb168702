"""Resuming from a checkpoint gives the metrics of an uninterrupted run (float32, CPU)."""

import glmrl  # noqa: F401

import numpy as np

from glmrl.train import loop
from tests.train.common import tiny_config

KEYS = ("reward/mean", "loss", "grad_norm", "advantage/std", "policy/entropy", "learning_rate")


def run_steps(workdir, n):
  trainer = loop.Trainer(tiny_config(), str(workdir))
  try:
    out = [trainer.step() for _ in range(n)]
    trainer.save(force=True)
    return out, trainer.step_index
  finally:
    trainer.close()


def test_resume_equals_uninterrupted(tmp_path):
  straight, _ = run_steps(tmp_path / "straight", 4)
  first, step = run_steps(tmp_path / "resumed", 2)
  assert step == 2
  second, step = run_steps(tmp_path / "resumed", 2)  # picks up the checkpoint of step 2
  assert step == 4
  for want, got in zip(straight, first + second):
    for k in KEYS:
      np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-9, err_msg=k)
