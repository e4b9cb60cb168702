"""Learner time per step with and without a separate old-log-prob pass, side by side in one run.

With num_iterations = 1 the update takes old = stop_gradient(new) in its own micro-batch loss, so
the learner runs one forward + backward per step. Before, a separate jitted full-batch forward
computed the old log-probs first (and with beta > 0 a second one for the reference policy). Both
are timed on the same rollout of the demo config (tiny random GLM-Image), interleaved; one rollout
(sampling + decoding + rewards) is timed too, to put the saving into a whole step.

  python bench/old_logprob_pass.py [--group_size 8 --micro_batch_size 0 --compute_dtype float32 --reps 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import glmrl  # noqa: E402,F401

import jax  # noqa: E402

from bench.timing import interleaved_medians  # noqa: E402
from configs import demo  # noqa: E402
from glmrl.train import loop  # noqa: E402
from glmrl.policy import ar as ar_policy  # noqa: E402


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--group_size", type=int, default=8)
  parser.add_argument("--micro_batch_size", type=int, default=0)
  parser.add_argument("--compute_dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--beta", type=float, default=0.0, help="KL weight; > 0 adds the reference pass")
  parser.add_argument("--reps", type=int, default=10)
  args = parser.parse_args(argv)

  config = demo.get_config()
  config.grpo.group_size = args.group_size
  config.train.micro_batch_size = args.micro_batch_size
  config.model.compute_dtype = args.compute_dtype
  config.grpo.beta = args.beta
  config.log.image_interval = 0
  trainer = loop.Trainer(config, tempfile.mkdtemp(prefix="bench_old_logprob_"))
  run, ar = trainer.run, trainer.states["ar"]
  start = time.perf_counter()
  collected = loop.rollout_lib.collect(run, next(run.iterator), jax.random.key(0), {"ar": ar.trainable})
  rollout, shape = collected.batches["ar"], collected.update_shapes["ar"]
  first_rollout_s = time.perf_counter() - start
  rollout_s = interleaved_medians(
      [lambda: loop.rollout_lib.collect(run, next(run.iterator), jax.random.key(1), {"ar": ar.trainable})],
      max(args.reps // 3, 1))[0]

  spec = run.policies["ar"].spec(*shape)
  # Not donating: every call starts from the same state (the cost of the arithmetic is the same).
  update = jax.jit(functools.partial(ar_policy.update, ar.graphdef, spec=spec, tx=ar.tx, schedule=ar.schedule))
  logprob_pass = jax.jit(functools.partial(ar_policy.rollout_logprobs, ar.graphdef,
                                           spec=dataclasses.replace(spec, micro_batches=1)))
  params, frozen, opt_state, ref = ar.trainable, ar.frozen, ar.opt_state, ar.reference

  def fused():
    jax.block_until_ready(update(params, frozen, opt_state, rollout, ref, True))

  def separate():
    old = logprob_pass(params, frozen, rollout)
    ref_logp = logprob_pass(ref, frozen, rollout) if ref is not None else None
    jax.block_until_ready(update(params, frozen, opt_state, rollout.replace(old_logp=old, ref_logp=ref_logp),
                                 None, False))

  def pass_only():
    jax.block_until_ready(logprob_pass(params, frozen, rollout))

  fused_s, separate_s, pass_s = interleaved_medians([fused, separate, pass_only], args.reps, warmup=True)
  trainer.close()

  b, n = rollout.sampler_logp.shape
  print(f"demo config: batch {b} ({config.data.prompts_per_step} prompts x {args.group_size}), {n} generated "
        f"tokens, {spec.micro_batches} micro-batch(es), compute {args.compute_dtype}, beta {args.beta}; "
        f"jax {jax.devices()[0].platform} x{jax.device_count()}, median of {args.reps}")
  print(f"rollout (sample + decode + rewards): {rollout_s * 1e3:.0f} ms (first, with compilation: "
        f"{first_rollout_s:.1f} s)")
  print(f"separate old-log-prob forward alone: {pass_s * 1e3:.0f} ms")
  print(f"learner, separate pass(es) + update: {separate_s * 1e3:.0f} ms")
  print(f"learner, update only (old = stop_gradient(new)): {fused_s * 1e3:.0f} ms")
  saved = separate_s - fused_s
  print(f"saved per step: {saved * 1e3:.0f} ms = {saved / separate_s:.1%} of the learner, "
        f"{saved / (separate_s + rollout_s):.1%} of a step")


if __name__ == "__main__":
  main()
