"""Runs two train steps on a given mesh and prints their metrics and a parameter checksum as JSON.

python -m tests.train.multidevice_run --devices=8 --mesh=2,2,2 --workdir=DIR
"""

import argparse
import json
import os
import sys


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--devices", type=int, required=True)
  parser.add_argument("--mesh", required=True)
  parser.add_argument("--workdir", required=True)
  args = parser.parse_args()
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
  import jax
  import numpy as np

  from glmrl.train import loop
  from tests.train.common import tiny_config

  data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
  config = tiny_config(mesh__data=data, mesh__fsdp=fsdp, mesh__tensor=tensor, train__micro_batch_size=4)
  trainer = loop.Trainer(config, args.workdir)
  steps = [trainer.step() for _ in range(2)]
  shardings = {str(s.spec) for s in jax.tree.leaves(jax.tree.map(lambda x: x.sharding, trainer.params))}
  leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(trainer.params)]
  trainer.close()
  json.dump({"devices": jax.device_count(), "steps": [{k: float(v) for k, v in s.items()} for s in steps],
             "param_sum": float(sum(x.sum() for x in leaves)),
             "param_abs_sum": float(sum(np.abs(x).sum() for x in leaves)),
             "shardings": sorted(shardings)}, sys.stdout)


if __name__ == "__main__":
  main()
