"""Runs two train steps on each given mesh and prints their metrics and a parameter checksum as JSON, by mesh.

python -m tests.train.multidevice_run --devices=8 --mesh=2,2,2[/1,8,1...] --workdir=DIR

Prints {"devices": n, "runs": {"d,f,t": {"steps", "param_sum", "param_abs_sum", "shardings", "layout"}}}: the meshes
of one device count share a process (its start-up, the tokenizers, the programs every mesh has in common).
"""

import json
import os
import sys

from tests.train.common import device_run_args, meshes, tiny_config


def main():
  args, _ = device_run_args()
  import jax

  runs = {}
  for data, fsdp, tensor in meshes(args):
    name = f"{data},{fsdp},{tensor}"
    runs[name] = train_two_steps(data, fsdp, tensor, os.path.join(args.workdir, name))
  json.dump({"devices": jax.device_count(), "runs": runs}, sys.stdout)


def train_two_steps(data: int, fsdp: int, tensor: int, workdir: str) -> dict:
  import jax
  import numpy as np

  from glmrl.train import loop

  config = tiny_config(mesh__data=data, mesh__fsdp=fsdp, mesh__tensor=tensor, train__micro_batch_size=4)
  trainer = loop.Trainer(config, workdir)
  layout = {"init": state_layout(trainer)}
  steps = [trainer.step() for _ in range(2)]
  layout["after_steps"] = state_layout(trainer)
  shardings = {str(s.spec) for s in jax.tree.leaves(jax.tree.map(lambda x: x.sharding, trainer.states["ar"].trainable))}
  leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(trainer.states["ar"].trainable)]
  trainer.close()
  return {"steps": [{k: float(v) for k, v in s.items()} for s in steps],
          "param_sum": float(sum(x.sum() for x in leaves)), "param_abs_sum": float(sum(np.abs(x).sum() for x in leaves)),
          "shardings": sorted(shardings), "layout": layout}


def state_layout(trainer) -> dict:
  """Bytes on device 0 of the params and the optimizer state, and the state leaves not sharded like
  their parameter (by glmrl.train.optimizer.state_shardings' path rule)."""
  import jax

  from glmrl.policy import optimizer

  def dev0_bytes(tree):
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device.id == 0)

  want = optimizer.state_shardings(trainer.states["ar"].opt_state, trainer.states["ar"].trainable, trainer.run.mesh)
  ar = trainer.states["ar"]
  wrong = [str(x.sharding.spec) for x, w in zip(jax.tree.leaves(ar.opt_state), jax.tree.leaves(want))
           if not x.sharding.is_equivalent_to(w, x.ndim)]
  return {"params_dev0": dev0_bytes(ar.trainable), "opt_state_dev0": dev0_bytes(ar.opt_state),
          "opt_leaves_not_like_params": wrong}


if __name__ == "__main__":
  main()
