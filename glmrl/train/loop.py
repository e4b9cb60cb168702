"""`python main.py --mode=train`: the GRPO loop over rollouts, updates, logging and checkpoints."""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
from absl import logging

from glmrl.runtime import agreement
from glmrl.runtime import device_memory
from glmrl import sharding as sharding_lib
from glmrl.checkpoint import StopSignal, TrainCheckpointer
from glmrl.checkpoint.lock import WorkdirLock
from glmrl.checkpoint.manager import AR_CONFIG_FILE, saved_steps
from glmrl.checkpoint.step_files import newest_is_complete, read_meta, step_problem
from glmrl.errors import UserError
from glmrl.evaluation import monitors
from glmrl.logging import run_writer
from glmrl.logging.progress import Progress, console
from glmrl.rewards.remote import RemoteRewardError
from glmrl.train import evaluate as evaluate_lib
from glmrl.train import resolved_config
from glmrl.train import rollout as rollout_lib
from glmrl.train import setup as setup_lib
from glmrl.train import workdir as workdir_lib
from glmrl.train.watchdog import Watchdog


class NonFiniteError(RuntimeError):
  """Too many consecutive steps with a NaN or infinite loss or reward."""


class Trainer:
  """Holds the run's state between steps: the trained policies' states by name (`glmrl.policy`); `step()` does
  one rollout and every policy's updates."""

  def __init__(self, config, workdir: str):
    self.config, self.workdir = config, workdir
    directory, saved = os.path.join(workdir, "checkpoints"), saved_steps(workdir)
    resume = read_meta(directory, saved[-1]) if saved and not step_problem(directory, saved[-1]) else None
    self.run = setup_lib.build(config, train=True, workdir=workdir, logs=True,
                               resume_data=resume and resume.get("data"))
    self.states = self.run.states
    self.root_key = jax.random.key(config.seed)
    self.step_index = 0
    configs = self.run.pipeline.configs
    # The generator's architecture always (evaluation reads it), each trained model's for the export.
    records = {AR_CONFIG_FILE: configs.ar.to_hf()}
    records.update({s.policy.saved.model_config_file: getattr(configs, s.policy.component).to_hf()
                    for s in self.states.values()})
    self.checkpointer = TrainCheckpointer(
        workdir, config.checkpoint.save_interval, config.checkpoint.max_to_keep,
        items=tuple(self._saved_items()),
        records=records, source_checkpoint_dir=config.model.checkpoint_dir,
        adapters={s.policy.saved.adapters_file: (s.adapters_record(), s.policy.saved.lora_section)
                  for s in self.states.values()})
    self.writer = run_writer(workdir, config)
    self.nonfinite_run = 0
    self.nonfinite_total = 0
    prefixes = [p.prefix(tuple(self.run.policies)) for p in self.run.policies.values()]
    self.watchdog = Watchdog(prefixes)
    self.hacking = monitors.HackingWatch(prefixes, config.eval.hacking_patience)
    self._compiled = {}
    self._restore()

  # ------------------------------------------------------------- checkpoints
  def _saved_items(self) -> dict:
    """Each policy's checkpoint items: its params (`PolicyState.checkpoint_params`) and optimizer state."""
    return {name: item for state in self.states.values() for name, item in state.checkpoint_items().items()}

  def _restore(self):
    abstract = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), t)
    # The newest step that restores: an unreadable newer one is reported and set aside, not fatal.
    restored = self.checkpointer.restore_latest({k: abstract(v) for k, v in self._saved_items().items()},
                                                self.root_key)
    if restored is None:
      return
    _, items, key, meta = restored
    for state in self.states.values():
      saved = state.policy.saved
      state.trainable = state.trainable_of(items[saved.params])
      state.opt_state = items[saved.opt_state]
      if state.ema is not None:
        state.ema = state.trainable_of(items[saved.ema])
    self.root_key = key
    self.step_index = int(meta["step"])
    self.run.iterator.restore(meta["data"])
    self.nonfinite_total = int(meta.get("nonfinite_total", 0))
    logging.info("resumed from %s at step %d", self.checkpointer.directory, self.step_index)

  def save(self, *, force: bool = False):
    """Saves on the interval (or when forced), unless this step is already saved."""
    if self.checkpointer.latest_step() == self.step_index:
      return False
    meta = {"step": self.step_index, "data": self.run.iterator.state(), "nonfinite_total": self.nonfinite_total}
    return self.checkpointer.save(self.step_index, self._saved_items(), self.root_key, meta, force=force)

  # -------------------------------------------------------------- the step
  def update_fn(self, name: str, shape: tuple):
    """The jitted update of policy `name` for its update shape (one per run)."""
    key = (name, shape)
    if key not in self._compiled:
      self._compiled[key] = self.run.policies[name].make_update(self.states[name], shape)
    return self._compiled[key]

  def _updates(self, name: str, collected, extra) -> dict:
    """Policy `name`'s num_iterations updates on its rollout batch; returns their metrics under its prefix."""
    run, state = self.run, self.states[name]
    policy = run.policies[name]
    prefix = policy.prefix(tuple(run.policies))
    batch = collected.batches[name]
    update_fn = self.update_fn(name, collected.update_shapes[name])
    per_iter = []
    for it in range(policy.settings.num_iterations):
      with sharding_lib.use_mesh(run.mesh):  # the activations' batch constraints
        state.trainable, state.opt_state, m, outputs = update_fn(
            state.trainable, state.frozen, state.opt_state, batch, policy.anchors(state), it == 0)
      state.update_ema("update", self.step_index + 1)  # DGPO's ema_ref: after every optimizer step
      if it == 0:
        # The first update computed the old (and reference) log-probs; the later ones read them.
        batch, first_metrics = policy.after_first(batch, outputs)
        extra.update({prefix + k: v for k, v in first_metrics.items()})
      per_iter.append(m)
    return _iteration_metrics(per_iter, prefix)

  def step(self) -> dict:
    """One rollout batch and every trained policy's updates; returns the logged scalars."""
    cfg, run = self.config, self.run
    t0 = time.perf_counter()
    data_state = run.iterator.state()
    data_batch = next(run.iterator)
    # Keys derive from (seed, step): a resumed run draws what an uninterrupted one would.
    key = jax.random.fold_in(self.root_key, self.step_index)
    try:
      collected = rollout_lib.collect(run, data_batch, key,
                                      {n: run.policies[n].rollout_trainable(s) for n, s in self.states.items()},
                                      self.step_index)
    except RemoteRewardError:
      run.iterator.restore(data_state)  # the unfinished step's prompts come first again on resume
      raise
    extra, timings = dict(collected.metrics), collected.timings
    extra.update(monitors.image_monitors(collected.images, run.request.images_per_prompt))
    t1 = time.perf_counter()
    # A non-finite reward makes the advantages and loss non-finite, and the update skips itself; the
    # step reads whether it did only with the logged scalars (no extra host round trip).
    metrics = {}
    for name in self.states:
      metrics.update(self._updates(name, collected, extra))
      self.states[name].update_ema("rollout", self.step_index + 1)
    metrics["skipped"] = jnp.max(jnp.stack([v for k, v in metrics.items() if k.endswith("skipped")]))
    scalars = jax.device_get({**extra, **metrics})
    t2 = time.perf_counter()

    skipped = scalars["skipped"] > 0
    self.nonfinite_run = self.nonfinite_run + 1 if skipped else 0
    self.nonfinite_total += int(skipped)
    self.step_index += 1
    scalars.update({
        "time/rollout": timings["rollout"], "time/reward": timings["reward"], "time/update": t2 - t1,
        "time/step": t2 - t0, "time/sampling": timings["sampling"], "time/decode": timings["decode"],
        "time/reward_wait": timings["reward_wait"],
        **{f"time/reward/{name}": seconds for name, seconds in timings["rewards"].items()},
        "throughput/samples_per_s": run.batch_size / max(timings["rollout"], 1e-9),
        "throughput/tokens_per_s": collected.tokens / max(timings["rollout"], 1e-9),
        "nonfinite/skipped_total": self.nonfinite_total,
    })
    peak = device_memory.peak_bytes()
    if peak is not None:
      scalars["memory/peak_gib"] = peak / 2**30
    watchdog_metrics, warnings = self.watchdog.update(self.step_index, scalars)
    scalars.update(watchdog_metrics)
    for warning in warnings:
      logging.warning("%s", warning)
    self.hacking.step(scalars)
    image_step = cfg.log.image_interval and (self.step_index % cfg.log.image_interval == 0 or self.step_index == 1)
    if image_step:
      host_images = sharding_lib.to_host(collected.images)
      scalars["monitor/jpeg_kb"] = monitors.jpeg_kb(host_images)
    self.writer.write_scalars(self.step_index, scalars)
    if image_step:
      self.writer.write_samples(self.step_index, host_images, collected.prompts,
                                sharding_lib.to_host(collected.total), tag="train_samples",
                                ncols=run.request.images_per_prompt)
    if self.nonfinite_run >= cfg.train.max_consecutive_nonfinite:
      raise NonFiniteError(f"{self.nonfinite_run} consecutive steps had a non-finite loss or reward (step "
                           f"{self.step_index}); stopping (config.train.max_consecutive_nonfinite="
                           f"{cfg.train.max_consecutive_nonfinite})")
    return scalars

  def close(self):
    self.checkpointer.close()
    self.writer.close()


def _iteration_metrics(per_iter: list[dict], prefix: str) -> dict:
  """Unprefixed: the last update; first_iter/: the first (on-policy: its ratio is exactly 1); iter<k>/:
  every update when there are several. All under the policy's `prefix`."""
  metrics = dict(per_iter[-1])
  metrics.update({f"first_iter/{k}": v for k, v in per_iter[0].items()})
  if len(per_iter) > 1:
    metrics.update({f"iter{i}/{k}": v for i, m in enumerate(per_iter) for k, v in m.items()})
  metrics["skipped"] = jnp.max(jnp.stack([m["skipped"] for m in per_iter]))
  return {prefix + k: v for k, v in metrics.items()}


def train(config, workdir: str) -> dict:
  """Trains until config.train.num_steps; SIGTERM / Ctrl-C save a checkpoint and return.

  Returns {"step", "last" (the last step's scalars), "stopped_by" (signal name or None)}.
  """
  created = not os.path.isdir(workdir)
  os.makedirs(workdir, exist_ok=True)
  num_steps = config.train.num_steps
  saved = saved_steps(workdir)
  # Only a step that reads is a finished run; an incomplete newer one is set aside by the restore.
  if agreement.checked(lambda: newest_is_complete(os.path.join(workdir, "checkpoints"), saved)) and \
      saved[-1] >= num_steps:
    logging.info("already complete: %s holds step %d of %d; raise --config.train.num_steps to train further",
                 os.path.join(workdir, "checkpoints"), saved[-1], num_steps)
    return {"step": saved[-1], "last": {}, "stopped_by": None}
  as_found = workdir_lib.AsFound(workdir, created)
  lock = WorkdirLock(workdir)
  try:
    # Until the first step has finished nothing is unsaved: a signal exits at once, also mid-compile, and leaves the
    # workdir as it was.
    with StopSignal(cleanup=[lock.release, as_found.restore],
                    what="nothing new to save (no step finished yet)") as stop, lock:
      as_found.start()
      return _train(config, workdir, stop, as_found)
  except UserError:
    as_found.restore()  # bad input leaves no trace
    raise


def _train(config, workdir: str, stop: StopSignal, as_found) -> dict:
  num_steps = config.train.num_steps
  trainer = Trainer(config, workdir)
  # The resolved config (defaults, file and flags), written once the inputs have passed every check.
  config_path = resolved_config.write(config, workdir)
  # Rows of steps after the restored one are redone by this run: drop them, no duplicates.
  trainer.writer.drop_rows_after(trainer.step_index)
  progress = Progress(num_steps, trainer.step_index)
  last, stopped_by = {}, None
  try:
    if trainer.step_index < num_steps:
      logging.info("step %d/%d: compiling the rollout and update programs (the first step takes longer)",
                   trainer.step_index + 1, num_steps)
    while trainer.step_index < num_steps:
      last = trainer.step()
      stop.work_in_progress()  # a finished step: a signal now saves it before exiting
      as_found.keep()
      console(progress.line(trainer.step_index, last),
              progress.alive(jax.process_index(), trainer.step_index, last))
      # Every process stops after the same step: the one whose signal any of them had by now.
      stopping = agreement.stop_signal(stop.received)
      trainer.save()
      if config.eval.interval and trainer.step_index % config.eval.interval == 0 and not stopping:
        evaluated = evaluate_lib.run_eval(trainer.run, trainer.run.sampling_params(), trainer.writer,
                                          trainer.step_index)
        hacking, warnings = trainer.hacking.evaluated(trainer.step_index, evaluated)
        trainer.writer.write_scalars(trainer.step_index, hacking)
        for warning in warnings:
          logging.warning("%s", warning)
      if stopping:
        stopped_by, by = stopping
        where = f" (received by process {by})" if jax.process_count() > 1 else ""
        logging.warning("stopping at step %d on %s%s", trainer.step_index, stopped_by, where)
        break
    trainer.save(force=True)
  except RemoteRewardError as e:
    # A reward server gone mid-run: the finished steps are kept. With several processes the others wait for
    # this one at a collective (jax.distributed ends them), so a save, itself collective, cannot be made.
    if jax.process_count() > 1 or not trainer.step_index:
      raise
    trainer.save(force=True)
    raise RemoteRewardError(f"{e}; step {trainer.step_index} is saved in {trainer.checkpointer.directory}: "
                            "rerun once the server answers to resume") from None
  finally:
    trainer.close()
  outputs = {"checkpoints": trainer.checkpointer.directory, "metrics": os.path.join(workdir, "metrics.jsonl"),
             "TensorBoard events": workdir}
  if config.log.image_interval:
    outputs["sample grids"] = os.path.join(workdir, "samples")
  console(progress.summary(trainer.step_index, {**outputs, "config": config_path}, stopped_by))
  return {"step": trainer.step_index, "last": last, "stopped_by": stopped_by}
