"""Training checkpoints: `<workdir>/checkpoints/<step>/{params,opt_state,rng,meta}`.

`params` holds the whole AR generator's parameter state (trainable and frozen
parts, the same paths as a converted checkpoint), so `python -m
checkpoints_convert --to_hf --ckpt_dir=<workdir>` exports it; the generator's
HF config sits beside the steps as `ar_config.json`.
"""

import json
import os

import jax
import orbax.checkpoint as ocp

AR_CONFIG_FILE = "ar_config.json"


class TrainCheckpointer:
  """CheckpointManager with async saves every `save_interval` steps, keeping the last `max_to_keep`."""

  def __init__(self, workdir: str, save_interval: int, max_to_keep: int, ar_hf_config: dict | None = None):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    os.makedirs(self.directory, exist_ok=True)
    if ar_hf_config is not None:
      with open(os.path.join(self.directory, AR_CONFIG_FILE), "w") as f:
        json.dump(ar_hf_config, f, indent=2, sort_keys=True)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            save_interval_steps=save_interval, max_to_keep=max_to_keep, enable_async_checkpointing=True),
        item_names=("params", "opt_state", "rng", "meta"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, params, opt_state, rng_key, meta: dict, *, force: bool = False) -> bool:
    """Saves (asynchronously) if `step` is on the interval or `force`; returns whether it saved."""
    return self.manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            rng=ocp.args.StandardSave({"key_data": jax.random.key_data(rng_key)}),
            meta=ocp.args.JsonSave(meta)),
        force=force)

  def restore(self, step: int, abstract_params, abstract_opt_state, abstract_rng_key):
    """Restores onto the shardings carried by the abstract trees; returns (params, opt_state, key, meta)."""
    key_data = jax.eval_shape(jax.random.key_data, abstract_rng_key)
    restored = self.manager.restore(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params),
            opt_state=ocp.args.StandardRestore(abstract_opt_state),
            rng=ocp.args.StandardRestore({"key_data": key_data}),
            meta=ocp.args.JsonRestore()))
    key = jax.random.wrap_key_data(restored.rng["key_data"], impl=jax.random.key_impl(abstract_rng_key))
    return restored.params, restored.opt_state, key, restored.meta

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
