"""Both policies (ar+decoder) on a given mesh: two steps straight (saving after each), and the second step again
by a new trainer resumed from a copy of the first step's checkpoint; prints their metrics, the trained states'
checksums and shardings as JSON.

python -m tests.train.decoupled_run --devices=8 --mesh=2,2,2 --workdir=DIR
"""

import json
import os
import shutil
import sys

from tests.train.common import decoupled_config, device_run_args


def main():
  args, (data, fsdp, tensor) = device_run_args()
  import jax
  import numpy as np

  from glmrl.train import loop

  config = decoupled_config(mesh__data=data, mesh__fsdp=fsdp, mesh__tensor=tensor)

  def checksums(trainer):
    out = {}
    for name, tree in (("ar", trainer.states["ar"].trainable), ("dit", trainer.states["decoder"].trainable)):
      leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]
      out[name] = [float(sum(x.sum() for x in leaves)), float(sum(np.abs(x).sum() for x in leaves))]
    return out

  def steps(workdir, n, copy_first_to=None):
    trainer = loop.Trainer(config, workdir)
    try:
      scalars = []
      for _ in range(n):
        scalars.append({k: float(v) for k, v in trainer.step().items() if not k.startswith("time/")
                        and not k.startswith("throughput/")})
        trainer.save(force=True)
        if copy_first_to and trainer.step_index == 1:
          trainer.checkpointer.wait()
          shutil.copytree(workdir, copy_first_to)
      sums = checksums(trainer)
      shardings = sorted({str(x.sharding.spec) for x in jax.tree.leaves(trainer.states["decoder"].trainable)})
    finally:
      trainer.close()
    return scalars, sums, shardings

  resumed_dir = os.path.join(args.workdir, "resumed")
  straight, sums, shardings = steps(os.path.join(args.workdir, "straight"), 2, copy_first_to=resumed_dir)
  second, resumed_sums, _ = steps(resumed_dir, 1)
  json.dump({"devices": jax.device_count(), "straight": straight, "resumed_second": second[0], "sums": sums,
             "resumed_sums": resumed_sums, "dit_shardings": shardings}, sys.stdout)


if __name__ == "__main__":
  main()
