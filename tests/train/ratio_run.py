"""The first update's importance ratio for {float32, bfloat16 compute} x {1, 2, 4 micro-batches} on a mesh.

Prints JSON {"devices": n, "ratios": {"<compute dtype>/<micro-batches>": [min, max]}, "sampler_gaps": {same keys:
max |learner old log-prob - sampler log-prob|}} (the sampler computes in float32). Run as
python -m tests.train.ratio_run --devices=8 --mesh=2,2,2 --workdir=DIR (XLA_FLAGS must be set before jax
is imported, hence a subprocess).
"""

import dataclasses
import json
import sys

from tests.train.common import device_run_args, tiny_config


def main():
  args, (data, fsdp, tensor) = device_run_args()
  import jax
  import jax.numpy as jnp
  from flax import nnx

  if args.devices > 1:
    # jax 0.10.2 on CPU: an 8-device update loaded from the persistent compilation cache (tests/conftest.py)
    # can deadlock in its collectives' rendezvous (also with the code before this test); compile afresh.
    jax.config.update("jax_enable_compilation_cache", False)

  from glmrl.models import glm_image
  from glmrl.policy import ar as ar_policy
  from glmrl.train import loop

  # 2 prompts x 8 samples: micro-batches of 16, 8 and 4 rows, each divisible over data x fsdp = 4.
  config = tiny_config(mesh__data=data, mesh__fsdp=fsdp, mesh__tensor=tensor, grpo__group_size=8)
  trainer = loop.Trainer(config, args.workdir)
  run, ar = trainer.run, trainer.states["ar"]
  collected = loop.rollout_lib.collect(run, next(run.iterator), jax.random.key(5), {"ar": ar.trainable})
  rollout, shape = collected.batches["ar"], collected.update_shapes["ar"]
  copy = lambda tree: jax.tree.map(jnp.copy, tree)
  ratios, gaps = {}, {}
  for dtype in ("float32", "bfloat16"):
    # The same parameters under a graph that computes in `dtype` (the compute dtype is the graph's, not the state's).
    ar_cfg = dataclasses.replace(run.pipeline.configs.ar, dtype=glm_image.DTYPES[dtype])
    graphdef, abstract = glm_image.abstract_model("ar", ar_cfg)
    graphdef = nnx.split(nnx.merge(graphdef, abstract), ar_policy.TRAINABLE, ...)[0]
    # On 8 devices the whole batch and the smallest micro-batches (4 rows, one per data x fsdp device); the
    # 1-device run covers 2 as well (each is a fresh compilation on 8 devices, see above).
    for micro in (1, 2, 4) if args.devices == 1 else (1, 4):
      spec = dataclasses.replace(run.policies["ar"].spec(*shape), micro_batches=micro)
      # Compiled as the trainer compiles it (donating copies of the state).
      fn = dataclasses.replace(ar, graphdef=graphdef).jit_update(ar_policy.update, spec)
      _, _, m, (old_logp, _) = fn(copy(ar.trainable), ar.frozen, copy(ar.opt_state), rollout, None, True)
      ratios[f"{dtype}/{micro}"] = [float(m["ratio/min"]), float(m["ratio/max"])]
      gaps[f"{dtype}/{micro}"] = float(jnp.max(jnp.abs(old_logp - rollout.sampler_logp)))
  trainer.close()
  json.dump({"devices": jax.device_count(), "ratios": ratios, "sampler_gaps": gaps}, sys.stdout)


if __name__ == "__main__":
  main()
