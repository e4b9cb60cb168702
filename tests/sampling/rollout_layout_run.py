"""The AR sampler on 8 host devices with the generator's weights in each rollout layout (float32 weights, bfloat16
compute); prints as JSON the greedy and sampled ids and log-probs of each layout and where and how the weights
lay.

python -m tests.sampling.rollout_layout_run --devices=8 --mesh=1,4,2 --workdir=DIR
"""

import dataclasses
import json
import sys

from tests.train.common import device_run_args, tiny_config


def main():
  args, (data, fsdp, tensor) = device_run_args()
  import jax
  import numpy as np

  from glmrl.sampling import rollout_weights
  from glmrl.train import loop

  rollout_weights.PART_BYTES = 2 ** 16  # the tiny generator resharded in several parts, as the released one is

  # float32 weights, bfloat16 compute: the gathered copy is cast to bfloat16 before the sampler reads it.
  config = tiny_config(mesh__data=data, mesh__fsdp=fsdp, mesh__tensor=tensor, model__compute_dtype="bfloat16")
  trainer = loop.Trainer(config, args.workdir)
  run, state = trainer.run, trainer.states["ar"]
  batch = next(run.iterator)
  prepared = run.pipeline.prepare(batch.prompts, ar_params=state.model_params())
  ga = run.request.grids_per_prompt
  keys = jax.random.split(jax.random.key(3), len(batch.prompts) * ga)
  out = {"devices": jax.device_count(),
         "reshard_parts": len(rollout_weights.Reshard(state.model_params(), run.pipeline.configs.ar.dtype).parts)}
  for greedy in (True, False):
    for layout in ("update", "gathered"):
      spec = dataclasses.replace(run.pipeline.spec, ar_weights=layout,
                                 sampling=dataclasses.replace(run.pipeline.spec.sampling, greedy=greedy))
      pipeline = type(run.pipeline)(run.pipeline.configs, run.pipeline.models, run.pipeline.processor,
                                    run.pipeline.glyph_tokenizer, spec, run.pipeline.mesh)
      sample = pipeline.sample_tokens(prepared, keys, ga, ar_params=state.model_params())
      weights = pipeline.rollout_ar_params(state.model_params())
      out[f"{layout}/{'greedy' if greedy else 'sampled'}"] = {
          "tokens": np.asarray(sample.tokens).tolist(), "logprobs": np.asarray(sample.logprobs).tolist(),
          "specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(weights)}),
          "dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(weights)})}
  trainer.close()
  json.dump(out, sys.stdout)


if __name__ == "__main__":
  main()
