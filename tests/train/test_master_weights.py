"""bfloat16 parameters train like float32 ones: float32 master weights and float32 gradient accumulation."""

import glmrl  # noqa: F401

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.train import loop
from glmrl.policy import optimizer as optimizer_lib
from glmrl.policy import ar as ar_policy
from tests.train.common import tiny_config

UPDATES = 50
LEARNING_RATE = 1e-6  # configs/glm_image_t2i.py


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """A float32 tiny run at the t2i learning rate (no warmup, a schedule long enough to stay at the peak)
  and one rollout of it."""
  config = tiny_config(optim__learning_rate=LEARNING_RATE, optim__warmup_steps=0, train__num_steps=100_000)
  trainer = loop.Trainer(config, str(tmp_path_factory.mktemp("master")))
  run = trainer.run
  collected = loop.rollout_lib.collect(run, next(run.iterator), jax.random.key(3),
                                       {"ar": trainer.states["ar"].trainable})
  rollout, shape = collected.batches["ar"], collected.update_shapes["ar"]
  yield trainer, rollout, run.policies["ar"].spec(*shape)
  trainer.close()


def flat(tree):
  return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def cosine(a, b):
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_bfloat16_updates_follow_the_float32_run(setup):
  """UPDATES on-policy updates of the same rollout from the same (bfloat16-representable) start, float32
  compute, at the t2i learning rate: the bfloat16 run moves along the float32 run.

  Without master weights (each ~1e-6 step rounded away on ~1e-2 weights) the bfloat16 parameters had
  cosine 0.07 with the float32 run's update and 0.5% of elements moved (float32: 77%). The total move,
  ~5e-5, is below half a bfloat16 ulp of most weights: what the forward reads can only show the float32
  trajectory at bfloat16 resolution, so the bfloat16 copy is compared with the float32 run rounded to
  bfloat16, the optimizer's float32 master copy with the float32 run itself.
  """
  trainer, rollout, spec = setup
  ar = trainer.states["ar"]
  fn = jax.jit(lambda p, o: ar_policy.update(ar.graphdef, p, ar.frozen, o, rollout, None, True, spec=spec, tx=ar.tx,
                                            schedule=ar.schedule)[:3])
  start16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), ar.trainable)
  start32 = jax.tree.map(lambda x: x.astype(jnp.float32), start16)
  ends = {}
  for name, start in (("f32", start32), ("bf16", start16)):
    params, opt_state = start, optimizer_lib.init(trainer.states["ar"].tx, start)
    for _ in range(UPDATES):
      params, opt_state, metrics = fn(params, opt_state)
    assert metrics["skipped"] == 0 and metrics["learning_rate"] > 0.99 * LEARNING_RATE
    ends[name] = params
    if name == "bf16":
      assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype("bfloat16")}
      ends["master"] = opt_state.params
  ends["f32_rounded"] = jax.tree.map(lambda x: x.astype(jnp.bfloat16), ends["f32"])
  moves = {k: flat(v) - flat(start32) for k, v in ends.items()}
  moved = {k: float(np.mean(v != 0)) for k, v in moves.items()}
  cos = {"master": cosine(moves["master"], moves["f32"]), "bf16": cosine(moves["bf16"], moves["f32_rounded"]),
         "bf16_vs_f32": cosine(moves["bf16"], moves["f32"])}
  print(f"cosine {cos}; fraction moved {moved}")
  # The optimizer's parameters differ from the float32 run only through the bfloat16 forward's rounding.
  assert cos["master"] > 0.9 and moved["master"] > 0.9 * moved["f32"]
  # What the forward reads moves as the float32 run does at bfloat16 resolution.
  assert cos["bf16"] > 0.9 and moved["bf16"] > 0.5 * moved["f32_rounded"]


def test_gradients_accumulate_in_float32(setup):
  """bfloat16 params, 4 micro-batches: the accumulated gradient is float32 and equals the float64 sum of
  the four micro-batch gradients (each taken from the same compiled program, with the other three
  micro-batches masked out, whose gradients are then exactly zero). A bfloat16 running sum would be
  off by its rounding, ~2^-9 relative."""
  trainer, rollout, spec = setup
  ar = trainer.states["ar"]
  spec = dataclasses.replace(spec, micro_batches=4)
  params16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), ar.trainable)
  fn = jax.jit(lambda p, r: ar_policy.accumulate_gradients(ar.graphdef, p, ar.frozen, r, None, True, spec=spec)[0])
  total = fn(params16, rollout)
  assert {x.dtype for x in jax.tree.leaves(total)} == {np.dtype("float32")}
  parts = []
  for i in range(4):  # micro-batch i holds rows i, i + 4, ... (strided)
    only_i = jnp.zeros_like(rollout.mask).at[i::4].set(rollout.mask[i::4])
    parts.append(flat(fn(params16, rollout.replace(mask=only_i))))
  want = np.sum(parts, axis=0)
  got = flat(total)
  # Each part is a bfloat16 gradient (8 significant bits): their float32 sum is exact but for
  # exponents 16 binades apart; 1e-6 relative of the largest element covers that.
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
  assert np.mean(got != 0) > 0.5


def test_bfloat16_run_resumes_with_its_master_weights(tmp_path):
  """The float32 master copy is part of the checkpointed optimizer state: a resumed bfloat16 run holds the
  very master weights and bfloat16 parameters it saved (not the master re-derived from the rounded params)."""
  config = tiny_config(model__param_dtype="bfloat16", checkpoint__save_interval=1)
  trainer = loop.Trainer(config, str(tmp_path))
  try:
    trainer.step()
    trainer.save(force=True)
    saved_params = jax.tree.map(np.asarray, trainer.states["ar"].trainable)
    saved_master = jax.tree.map(np.asarray, trainer.states["ar"].opt_state.params)
  finally:
    trainer.close()
  # The master copy holds what bfloat16 cannot: it is not the rounded parameters cast back.
  assert any(np.any(m != p.astype(np.float32)) for m, p in zip(jax.tree.leaves(saved_master),
                                                               jax.tree.leaves(saved_params)))
  resumed = loop.Trainer(config, str(tmp_path))
  try:
    ar = resumed.states["ar"]
    assert resumed.step_index == 1 and isinstance(ar.opt_state, optimizer_lib.MasterWeights)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b)), saved_master, ar.opt_state.params)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b)), saved_params, ar.trainable)
  finally:
    resumed.close()
