"""One GRPO train step on the tiny config: on-policy ratio 1, a real update, exact micro-batching."""

import glmrl  # noqa: F401

import dataclasses

import jax
import numpy as np
import pytest

from glmrl.train import loop
from glmrl.train import step as step_lib
from tests.train.common import tiny_config


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
  t = loop.Trainer(tiny_config(grpo__num_iterations=2), str(tmp_path_factory.mktemp("step")))
  yield t
  t.close()


def test_one_step(trainer):
  before = jax.tree.map(np.asarray, trainer.params)
  scalars = trainer.step()
  assert trainer.step_index == 1
  # The old log-probs come from the update's own function: the first ratio is exactly 1.
  assert scalars["first_iter/ratio/min"] == 1.0 and scalars["first_iter/ratio/max"] == 1.0
  # The second of the two policy iterations sees the policy the first one moved.
  assert scalars["ratio/min"] < 1.0 < scalars["ratio/max"]
  assert scalars["logprob/sampler_vs_recomputed_max_abs"] < 1e-5
  assert np.isfinite(scalars["loss"]) and scalars["grad_norm"] > 0 and scalars["skipped"] == 0
  for key in ("reward/mean", "reward/std", "reward/brightness/mean", "advantage/mean", "clip/low_frac",
              "policy/entropy", "learning_rate", "time/rollout", "throughput/tokens_per_s"):
    assert key in scalars, key
  changed = jax.tree.map(lambda a, b: bool(np.any(a != np.asarray(b))), before, trainer.params)
  assert any(jax.tree.leaves(changed))
  # Frozen parts (vision encoder, VQ) are not in the trained state and get no optimizer state.
  paths = {"/".join(map(str, p)) for p, _ in jax.tree_util.tree_leaves_with_path(trainer.params)}
  assert not any("visual" in p or "vq" in p for p in paths)


def test_micro_batches_give_the_full_batch_update(trainer):
  """Two micro-batches accumulate to exactly the one-batch gradient (float32, 1e-6 relative)."""
  run = trainer.run
  data_batch = next(run.iterator)
  rollout, *_ = loop.rollout_lib.collect(run, data_batch, jax.random.key(7), trainer.params,
                                                         None, trainer._fns)
  (prompt_len, layout), = trainer._compiled  # the run's one compiled shape
  results = []
  for micro in (1, 2):
    spec = dataclasses.replace(loop.update_spec(run, prompt_len, layout), micro_batches=micro)
    fn = jax.jit(lambda p, f, o, r, spec=spec: step_lib.update(run.ar_graphdef, p, f, o, r, spec=spec,
                                                                tx=trainer.tx, schedule=trainer.schedule))
    params, _, metrics = fn(trainer.params, run.frozen, trainer.opt_state, rollout)
    results.append((params, metrics))
  (p1, m1), (p2, m2) = results
  np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6, atol=1e-8)
  np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p1, p2)


def test_bfloat16_params_and_compute(tmp_path):
  """Parameters stored in bfloat16 with bfloat16 compute train a finite step (log-probs stay float32)."""
  trainer = loop.Trainer(tiny_config(model__param_dtype="bfloat16", model__compute_dtype="bfloat16",
                                     model__remat=True), str(tmp_path))
  try:
    assert {x.dtype for x in jax.tree.leaves(trainer.params)} == {np.dtype("bfloat16")}
    scalars = trainer.step()
    assert np.isfinite(scalars["loss"]) and scalars["skipped"] == 0 and scalars["grad_norm"] > 0
    assert scalars["first_iter/ratio/max"] == 1.0
  finally:
    trainer.close()
