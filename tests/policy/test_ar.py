"""One GRPO train step on the tiny config: on-policy ratio 1, a real update, exact micro-batching."""

import glmrl  # noqa: F401

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.train import loop
from glmrl.policy import optimizer as optimizer_lib
from glmrl.policy import accumulate
from glmrl.policy import ar as ar_policy
from tests.train.common import tiny_config


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
  t = loop.Trainer(tiny_config(grpo__num_iterations=2), str(tmp_path_factory.mktemp("step")))
  yield t
  t.close()


def test_one_step(trainer):
  before = jax.tree.map(np.asarray, trainer.states["ar"].trainable)
  scalars = trainer.step()
  assert trainer.step_index == 1
  # The first update's old log-probs are its own forward's: the first ratio is exactly 1.
  assert scalars["first_iter/ratio/min"] == 1.0 and scalars["first_iter/ratio/max"] == 1.0
  # The second of the two policy iterations sees the policy the first one moved.
  assert scalars["ratio/min"] < 1.0 < scalars["ratio/max"]
  assert scalars["logprob/sampler_vs_recomputed_max_abs"] < 1e-5
  # Every iteration is logged; unprefixed keys are the last one's.
  assert scalars["iter0/ratio/max"] == 1.0 and scalars["iter1/ratio/max"] == scalars["ratio/max"]
  # The schedule advanced once per update: 4 steps x 2 iterations = 8 updates, warmup 2 steps = 4 updates.
  lr = [scalars["iter0/learning_rate"], scalars["iter1/learning_rate"]]
  np.testing.assert_allclose(lr, [1e-3 / 4, 2e-3 / 4], rtol=1e-6)
  # The first and the second iteration ran one compiled program (`first` is traced, not static).
  (update_fn,) = trainer._compiled.values()
  assert update_fn._cache_size() == 1
  assert np.isfinite(scalars["loss"]) and scalars["grad_norm"] > 0 and scalars["skipped"] == 0
  for key in ("reward/mean", "reward/std", "reward/brightness/mean", "advantage/mean", "clip/low_frac",
              "policy/entropy", "learning_rate", "time/rollout", "throughput/tokens_per_s"):
    assert key in scalars, key
  # The rollout's time is its two parts' (the decode waits for the sampled tokens); host devices keep no
  # memory statistics, so no peak is logged here.
  assert scalars["time/sampling"] > 0 and scalars["time/decode"] > 0
  np.testing.assert_allclose(scalars["time/sampling"] + scalars["time/decode"], scalars["time/rollout"], rtol=1e-9)
  assert "memory/peak_gib" not in scalars
  changed = jax.tree.map(lambda a, b: bool(np.any(a != np.asarray(b))), before, trainer.states["ar"].trainable)
  assert any(jax.tree.leaves(changed))
  # Frozen parts (vision encoder, VQ) are not in the trained state and get no optimizer state.
  paths = {"/".join(map(str, p)) for p, _ in jax.tree_util.tree_leaves_with_path(trainer.states["ar"].trainable)}
  assert not any("visual" in p or "vq" in p for p in paths)


def test_micro_batches_give_the_full_batch_update(trainer):
  """Two micro-batches accumulate to exactly the one-batch gradient (float32, 1e-6 relative), on the
  first iteration (old log-probs from the forward) and on a later one (old log-probs given)."""
  run, ar = trainer.run, trainer.states["ar"]
  data_batch = next(run.iterator)
  collected = loop.rollout_lib.collect(run, data_batch, jax.random.key(7), {"ar": ar.trainable})
  rollout, shape = collected.batches["ar"], collected.update_shapes["ar"]
  # Group advantages have zero mean, which makes the on-policy loss zero up to rounding (whose value
  # depends on the summation order); shifted ones give a loss of order one to compare.
  rollout = rollout.replace(advantages=rollout.advantages + 0.25)
  results = []
  for micro in (1, 2):
    spec = dataclasses.replace(run.policies["ar"].spec(*shape), micro_batches=micro)
    fn = jax.jit(lambda p, f, o, r, first, spec=spec: ar_policy.update(
        ar.graphdef, p, f, o, r, None, first, spec=spec, tx=ar.tx, schedule=ar.schedule))
    params, opt_state, m_first, (old_logp, _) = fn(ar.trainable, ar.frozen, ar.opt_state, rollout, True)
    assert m_first["ratio/min"] == 1.0 and m_first["ratio/max"] == 1.0
    first_params = jax.tree.map(np.asarray, params)
    _, _, m_later, _ = fn(params, ar.frozen, opt_state, rollout.replace(old_logp=old_logp), False)
    assert m_later["ratio/min"] < 1.0 < m_later["ratio/max"]
    results.append((old_logp, first_params, m_first, m_later))
  # Parameters are compared after the first update only: AdamW's second step divides by the root of the
  # squared gradients, which turns rounding-level differences of near-zero gradients into full steps.
  (o1, p1, f1, l1), (o2, p2, f2, l2) = results
  np.testing.assert_allclose(o1, o2, rtol=1e-6, atol=1e-6)
  for a, b in ((f1, f2), (l1, l2)):
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p1, p2)


def test_bfloat16_params_and_compute(tmp_path):
  """Parameters stored in bfloat16 with bfloat16 compute train a finite step (log-probs stay float32); the
  optimizer holds their float32 master copy, of which the bfloat16 parameters are the rounding."""
  trainer = loop.Trainer(tiny_config(model__param_dtype="bfloat16", model__compute_dtype="bfloat16",
                                     model__remat=True), str(tmp_path))
  try:
    assert {x.dtype for x in jax.tree.leaves(trainer.states["ar"].trainable)} == {np.dtype("bfloat16")}
    assert isinstance(trainer.states["ar"].opt_state, optimizer_lib.MasterWeights)
    scalars = trainer.step()
    assert np.isfinite(scalars["loss"]) and scalars["skipped"] == 0 and scalars["grad_norm"] > 0
    assert scalars["first_iter/ratio/min"] == 1.0 and scalars["first_iter/ratio/max"] == 1.0
    master = trainer.states["ar"].opt_state.params
    assert {x.dtype for x in jax.tree.leaves(master)} == {np.dtype("float32")}
    jax.tree.map(lambda m, p: np.testing.assert_array_equal(np.asarray(m.astype(p.dtype)), np.asarray(p)),
                 master, trainer.states["ar"].trainable)
  finally:
    trainer.close()


def test_micro_batches_are_strided_and_merge_back():
  """Micro-batch i holds rows i, i + m, ...: every micro-batch takes rows of every device's block."""
  b, m, s = 8, 4, 3
  ids = np.arange(b * s).reshape(b, s)
  rollout = ar_policy.Rollout(
      sequence_ids=ids, positions=np.stack([ids, ids + 100, ids + 200]), valid=ids > 0,
      old_logp=ids.astype(np.float32), sampler_logp=ids.astype(np.float32),
      advantages=np.arange(b, dtype=np.float32), mask=np.ones((b, s), np.float32))
  micro = accumulate.split_micro(rollout, m)
  for i in range(m):
    np.testing.assert_array_equal(micro.sequence_ids[i], ids[i::m])
    np.testing.assert_array_equal(micro.positions[i], np.stack([ids, ids + 100, ids + 200])[:, i::m])
    np.testing.assert_array_equal(micro.advantages[i], np.arange(b)[i::m])
  np.testing.assert_array_equal(accumulate.merge_micro(micro.old_logp), ids)


def test_logprob_metrics_leave_the_forced_end_token_out_of_the_entropy():
  rng = np.random.default_rng(0)
  old = rng.uniform(-6.0, -0.1, (3, 5)).astype(np.float32)
  old[:, -1] = 0.0  # the end token, forced by the rule: log-prob 0
  sampler = old + rng.normal(0, 0.01, old.shape).astype(np.float32)
  forced = ar_policy.logprob_metrics(jnp.asarray(sampler), jnp.asarray(old), forced_end=True)
  free = ar_policy.logprob_metrics(jnp.asarray(sampler), jnp.asarray(old), forced_end=False)
  np.testing.assert_allclose(forced["policy/entropy"], -old[:, :-1].astype(np.float64).mean(), rtol=1e-6)
  np.testing.assert_allclose(free["policy/entropy"], -old.astype(np.float64).mean(), rtol=1e-6)
  np.testing.assert_allclose(forced["logprob/sampler_vs_recomputed_max_abs"],
                             np.abs(sampler.astype(np.float64) - old).max(), rtol=1e-6)


def test_lora_alpha_left_unset_is_the_rank():
  """`--config.lora.rank=4` alone launches, at scale alpha / rank = 1 (the DiT's adapters alike)."""
  from glmrl.config import validation
  from glmrl.policy import flow_grpo

  config = tiny_config(lora__rank=4, train__policies="ar+decoder")  # the decoder's adapters are read too
  config.decoder.lora.alpha = 0.0
  validation.validate(config)
  assert ar_policy.ArPolicy(config).settings.lora.alpha == 4.0
  assert flow_grpo.FlowGrpoPolicy(config).settings.lora.alpha == float(config.decoder.lora.rank)
  config.lora.alpha = 8.0
  assert ar_policy.ArPolicy(config).settings.lora.alpha == 8.0
