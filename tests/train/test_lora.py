"""LoRA training: only adapters train, the reference is the base with adapters off, the on-policy ratio is
exactly 1, resume is bit-identical, and adapters never resume onto another base (float32, CPU)."""

import json

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from glmrl.checkpoint import CheckpointError
from glmrl.checkpoint import params as params_lib
from glmrl.errors import UserError
from glmrl.models import lora
from glmrl.train import loop
from glmrl.policy import ar as ar_policy
from tests.train.common import tiny_config


def lora_config(**overrides):
  return tiny_config(**{"lora__rank": 4, "lora__alpha": 8.0, "grpo__beta": 0.05, **overrides})


def flat(state):
  return {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(state)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A LoRA trainer after two steps (remat on: frozen base weights inside remat'd layers), with copies of
  its adapters and base from before them."""
  trainer = loop.Trainer(lora_config(model__remat=True), str(tmp_path_factory.mktemp("lora")))
  before, base = flat(trainer.states["ar"].trainable), flat(trainer.run.states["ar"].frozen)
  metrics = [trainer.step() for _ in range(2)]
  yield trainer, before, base, metrics
  trainer.close()


def test_only_adapters_train_and_the_ratio_is_one(trained):
  trainer, before, base, metrics = trained
  after = flat(trainer.states["ar"].trainable)
  assert set(after) == set(before) and all(k.endswith(("lora_a", "lora_b")) for k in after)
  assert all(isinstance(v, lora.LoraParam) for _, v in nnx.to_flat_state(trainer.states["ar"].trainable))
  # Every adapter moved (B from its zero start); the base is bit for bit what it was.
  assert all(not np.array_equal(after[k], before[k]) for k in after)
  assert all(np.array_equal(v, base[k]) for k, v in flat(trainer.run.states["ar"].frozen).items())
  for m in metrics:  # old log-probs from the update's own forward: exp(0) exactly
    assert m["first_iter/ratio/min"] == 1.0 and m["first_iter/ratio/max"] == 1.0
  assert metrics[0]["kl"] == 0.0 and metrics[1]["kl"] > 0.0  # B = 0 at step 1: the policy is its reference


def test_kl_reference_is_the_base_model_exactly(trained):
  """The update's reference log-probs (adapters off, same program) equal those of the model built
  without adapters from the same base weights, bit for bit."""
  trainer, *_ = trained
  run, ar = trainer.run, trainer.states["ar"]
  collected = loop.rollout_lib.collect(run, next(run.iterator), jax.random.key(11), {"ar": ar.trainable})
  copy = lambda tree: jax.tree.map(jnp.copy, tree)
  update = trainer.update_fn("ar", collected.update_shapes["ar"])
  batch = collected.batches["ar"]
  _, _, _, (_, ref_logp) = update(copy(ar.trainable), ar.frozen, copy(ar.opt_state), batch, None, True)
  spec = run.policies["ar"].spec(*collected.update_shapes["ar"])
  plain = loop.setup_lib.build(tiny_config(grpo__beta=0.05, model__remat=True))  # same seed: the same base
  base_graphdef, base_trainable, base_frozen = nnx.split(
      nnx.merge(plain.states["ar"].graphdef, *plain.states["ar"].model_params()), ar_policy.TRAINABLE, ...)
  assert all(np.array_equal(v, flat(run.states["ar"].frozen)[k]) for k, v in flat(nnx.merge_state(
      base_trainable, base_frozen)).items())
  want = jax.jit(ar_policy.rollout_logprobs, static_argnums=(0, 4))(
      base_graphdef, base_trainable, base_frozen, collected.batches["ar"], spec)
  np.testing.assert_array_equal(np.asarray(ref_logp), np.asarray(want))


def run_steps(workdir, n, **overrides):
  trainer = loop.Trainer(lora_config(**overrides), str(workdir))
  try:
    out = []
    for _ in range(n):
      out.append(trainer.step())
      trainer.save()
    trainer.save(force=True)
    return out, trainer.step_index, flat(trainer.states["ar"].trainable)
  finally:
    trainer.close()


def test_resume_is_bit_identical_and_refuses_another_base(tmp_path):
  straight, _, want = run_steps(tmp_path / "straight", 4)
  first, _, _ = run_steps(tmp_path / "resumed", 2)
  second, step, got = run_steps(tmp_path / "resumed", 2)
  assert step == 4
  for a, b in zip(straight, first + second):
    assert a["loss"] == b["loss"] and a["reward/mean"] == b["reward/mean"] and a["kl"] == b["kl"]
  assert all(np.array_equal(got[k], want[k]) for k in want)
  # The checkpoints hold only the adapters (and optimizer state): no base weight is saved.
  stored = params_lib.stored_leaves(str(tmp_path / "resumed" / "checkpoints" / "4" / "params"))
  assert set(stored) == set(want)
  # Another base: the record names a base whose weights differ (the exact form of fingerprint, another value).
  record_path = tmp_path / "resumed" / "checkpoints" / "lora.json"
  record = record_path.read_text()
  other = json.loads(record)
  other["base"]["fingerprint"] = other["base"]["fingerprint"][:-8] + "00000000"
  record_path.write_text(json.dumps(other))
  with pytest.raises(CheckpointError, match="refusing to resume: the adapters .* were trained on the base"):
    loop.Trainer(lora_config(), str(tmp_path / "resumed"))
  record_path.write_text(record)
  # Another seed (which also draws another random base) changes the prompt order: refused before any model.
  other_seed = lora_config()
  other_seed.seed = 1
  with pytest.raises(UserError, match="saved with other prompts or another config.seed .*seed=0 differs"):
    loop.Trainer(other_seed, str(tmp_path / "resumed"))
  with pytest.raises(CheckpointError, match="holds LoRA adapter checkpoints .* full fine-tuning"):
    loop.Trainer(tiny_config(grpo__beta=0.05), str(tmp_path / "resumed"))
  with pytest.raises(CheckpointError, match="holds adapters with other settings .* rank 4 there, 8 here"):
    loop.Trainer(lora_config(lora__rank=8), str(tmp_path / "resumed"))
