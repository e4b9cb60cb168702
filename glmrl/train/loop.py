"""`python main.py --mode=train`: the GRPO loop over rollouts, updates, logging and checkpoints."""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from glmrl import sharding as sharding_lib
from glmrl.checkpoint import StopSignal, TrainCheckpointer
from glmrl.checkpoint.manager import DECODER_OPT_STATE, DECODER_PARAMS, saved_steps
from glmrl.logging import quiet_library_logs, run_writer
from glmrl.logging.progress import Progress
from glmrl.train import decoder_step
from glmrl.train import evaluate as evaluate_lib
from glmrl.train import optimizer as optimizer_lib
from glmrl.train import rollout as rollout_lib
from glmrl.train import setup as setup_lib
from glmrl.train import step as step_lib
from glmrl.train.sample import Policies


class NonFiniteError(RuntimeError):
  """Too many consecutive steps with a NaN or infinite loss or reward."""


class Trainer:
  """Holds the run's state between steps; `step()` does one rollout and its updates."""

  def __init__(self, config, workdir: str):
    self.config, self.workdir = config, workdir
    self.run = setup_lib.build(config)
    run = self.run
    self.trains_ar = "ar" in run.policies
    logging.info("policies %s; trainable AR parameters: %d (frozen: %d)", "+".join(run.policies),
                 setup_lib.num_params(run.trainable) if self.trains_ar else 0, setup_lib.num_params(run.frozen))
    self.params = run.trainable
    self.opt_state = self.ref_params = None
    if self.trains_ar:
      # The schedule counts updates: num_iterations of them per rollout step.
      self.tx, self.schedule = optimizer_lib.make_optimizer(config.optim, config.train.num_steps,
                                                            config.grpo.num_iterations)
      self.opt_state = _init_optimizer(self.tx, run.trainable, run.mesh)
      # The frozen reference policy: a copy of the initial parameters, only when the KL term is on; with
      # LoRA none (the update turns the adapters off instead: no second copy of any weight).
      if config.grpo.beta > 0 and not run.lora.enabled:
        self.ref_params = jax.tree.map(jnp.copy, run.trainable)
    self.dit_params = self.dit_opt_state = self.dit_ref_params = None
    if run.decoder is not None:
      self.dit_tx, self.dit_schedule = optimizer_lib.make_optimizer(config.decoder.optim, config.train.num_steps,
                                                                    config.decoder.num_iterations)
      self.dit_params = run.decoder.trainable
      self.dit_opt_state = _init_optimizer(self.dit_tx, self.dit_params, run.mesh)
      if config.decoder.beta > 0 and not run.decoder.lora.enabled:
        self.dit_ref_params = jax.tree.map(jnp.copy, self.dit_params)
    self.root_key = jax.random.key(config.seed)
    self.step_index = 0
    self.checkpointer = TrainCheckpointer(workdir, config.checkpoint.save_interval, config.checkpoint.max_to_keep,
                                          ar_hf_config=run.pipeline.configs.ar.to_hf(),
                                          source_checkpoint_dir=config.model.checkpoint_dir,
                                          adapters=setup_lib.adapters_record(run),
                                          decoder_adapters=setup_lib.decoder_adapters_record(run),
                                          trains_decoder=run.decoder is not None,
                                          dit_hf_config=run.pipeline.configs.dit.to_hf() if run.decoder else None)
    self.writer = run_writer(workdir)
    self.nonfinite_run = 0
    self.nonfinite_total = 0
    self._compiled = {}
    self._restore()

  # ------------------------------------------------------------- checkpoints
  def _saved_items(self) -> tuple:
    """(AR params, AR optimizer state, decoder items) as a checkpoint holds them (None: not trained)."""
    ar = (self.run.checkpoint_params(self.params), self.opt_state) if self.trains_ar else (None, None)
    decoder = {}
    if self.dit_params is not None:
      decoder = {DECODER_PARAMS: self.dit_params, DECODER_OPT_STATE: self.dit_opt_state}
    return (*ar, decoder)

  def _restore(self):
    abstract = lambda t: None if t is None else jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), t)
    params, opt_state, decoder = self._saved_items()
    # The newest step that restores: an unreadable newer one is reported and set aside, not fatal.
    restored = self.checkpointer.restore_latest(abstract(params), abstract(opt_state), self.root_key,
                                                {k: abstract(v) for k, v in decoder.items()})
    if restored is None:
      return
    _, params, opt_state, key, meta, decoder = restored
    if self.trains_ar:
      self.params = _select(params, self.params)
      self.opt_state = opt_state
    if decoder:
      self.dit_params, self.dit_opt_state = decoder[DECODER_PARAMS], decoder[DECODER_OPT_STATE]
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
    params, opt_state, decoder = self._saved_items()
    return self.checkpointer.save(self.step_index, params, opt_state, self.root_key, meta, extra=decoder,
                                  force=force)

  # -------------------------------------------------------------- the step
  def _update_fn(self, prompt_len: int, layout):
    """The jitted AR update of a prompt shape (one per run)."""
    key = (prompt_len, layout)
    if key not in self._compiled:
      spec = setup_lib.update_spec(self.config, prompt_len, layout)
      # The updated params and optimizer state keep the shardings the rules gave them.
      self._compiled[key] = step_lib.make_update(self.run.ar_graphdef, spec, self.tx, self.schedule,
                                                 param_shardings=_shardings(self.params),
                                                 opt_shardings=_shardings(self.opt_state))
    return self._compiled[key]

  def _decoder_update_fn(self):
    if "decoder" not in self._compiled:
      self._compiled["decoder"] = decoder_step.make_update(
          self.run.decoder.graphdef, setup_lib.decoder_spec(self.config), self.dit_tx, self.dit_schedule,
          param_shardings=_shardings(self.dit_params), opt_shardings=_shardings(self.dit_opt_state))
    return self._compiled["decoder"]

  def _ar_updates(self, collected, extra) -> dict:
    """The AR policy's num_iterations updates on the rollout; returns their metrics."""
    run, rollout = self.run, collected.batch
    update_fn = self._update_fn(*collected.update_shape)
    per_iter = []
    for it in range(self.config.grpo.num_iterations):
      with sharding_lib.use_mesh(run.mesh):  # the activations' batch constraints
        self.params, self.opt_state, m, (old_logp, ref_logp) = update_fn(
            self.params, run.frozen, self.opt_state, rollout, self.ref_params, it == 0)
      if it == 0:
        # The first update computed the old (and reference) log-probs; the later ones read them.
        rollout = rollout.replace(old_logp=old_logp, ref_logp=ref_logp)
        extra.update({rollout_lib.ar_prefix(run) + k: v for k, v in rollout_lib.logprob_metrics(
            rollout.sampler_logp, old_logp, forced_end=run.pipeline.spec.sampling.constrain_to_codebook).items()})
      per_iter.append(m)
    return _iteration_metrics(per_iter, rollout_lib.ar_prefix(run))

  def _decoder_updates(self, collected, extra) -> dict:
    """The decoder policy's updates on the rollout's SDE window; returns their metrics (decoder/...)."""
    run, rollout = self.run, collected.decoder_batch
    update_fn = self._decoder_update_fn()
    per_iter = []
    for it in range(self.config.decoder.num_iterations):
      with sharding_lib.use_mesh(run.mesh):
        self.dit_params, self.dit_opt_state, m, old_logp = update_fn(
            self.dit_params, run.decoder.frozen, self.dit_opt_state, rollout, collected.window, self.dit_ref_params,
            it == 0)
      if it == 0:
        rollout = rollout.replace(old_logp=old_logp)
        # The sampler's log-probs vs the learner's of the same steps: one guided velocity function, two programs.
        extra["decoder/logprob/sampler_vs_recomputed_max_abs"] = jnp.max(jnp.abs(rollout.sampler_logp - old_logp))
      per_iter.append(m)
    return _iteration_metrics(per_iter, "decoder/")

  def step(self) -> dict:
    """One rollout batch and its policy updates (AR, decoder or both); returns the logged scalars."""
    cfg, run = self.config, self.run
    t0 = time.perf_counter()
    data_batch = next(run.iterator)
    # Keys derive from (seed, step): a resumed run draws what an uninterrupted one would.
    key = jax.random.fold_in(self.root_key, self.step_index)
    collected = rollout_lib.collect(run, data_batch, key, self.params, self.dit_params)
    extra, timings = dict(collected.metrics), collected.timings
    t1 = time.perf_counter()
    # A non-finite reward makes the advantages and loss non-finite, and the update skips itself; the
    # step reads whether it did only with the logged scalars (no extra host round trip).
    metrics = {}
    if self.trains_ar:
      metrics.update(self._ar_updates(collected, extra))
    if run.decoder is not None:
      metrics.update(self._decoder_updates(collected, extra))
    metrics["skipped"] = jnp.max(jnp.stack([v for k, v in metrics.items() if k.endswith("skipped")]))
    scalars = jax.device_get({**extra, **metrics})
    t2 = time.perf_counter()

    skipped = scalars["skipped"] > 0
    self.nonfinite_run = self.nonfinite_run + 1 if skipped else 0
    self.nonfinite_total += int(skipped)
    self.step_index += 1
    scalars.update({
        "time/rollout": timings["rollout"], "time/reward": timings["reward"], "time/update": t2 - t1,
        "time/step": t2 - t0,
        "throughput/samples_per_s": run.batch_size / max(timings["rollout"], 1e-9),
        "nonfinite/skipped_total": self.nonfinite_total,
    })
    if collected.batch is not None:
      tokens = collected.batch.sampler_logp.shape[0] * collected.batch.sampler_logp.shape[1]
      scalars["throughput/tokens_per_s"] = tokens / max(timings["rollout"], 1e-9)
    self.writer.write_scalars(self.step_index, scalars)
    if cfg.log.image_interval and (self.step_index % cfg.log.image_interval == 0 or self.step_index == 1):
      self.writer.write_samples(self.step_index, sharding_lib.to_host(collected.images), collected.prompts,
                                sharding_lib.to_host(collected.total), tag="train_samples",
                                ncols=run.ar_group * run.decoder_group)
    if self.nonfinite_run >= cfg.train.max_consecutive_nonfinite:
      raise NonFiniteError(f"{self.nonfinite_run} consecutive steps had a non-finite loss or reward (step "
                           f"{self.step_index}); stopping (config.train.max_consecutive_nonfinite="
                           f"{cfg.train.max_consecutive_nonfinite})")
    return scalars

  def close(self):
    self.checkpointer.close()
    self.writer.close()


def _init_optimizer(tx, params, mesh):
  """Optimizer state, float32 whatever the parameter dtype (bfloat16 params get a float32 master copy and
  float32 AdamW moments). jit gives zeros_like outputs no sharding of their own, so each moment / master
  leaf is placed like its parameter explicitly (step counters replicated)."""
  init = functools.partial(optimizer_lib.init, tx)
  return jax.jit(init, out_shardings=optimizer_lib.state_shardings(jax.eval_shape(init, params), params, mesh))(params)


def _shardings(tree):
  return jax.tree.map(lambda x: x.sharding, tree)


def _iteration_metrics(per_iter: list[dict], prefix: str) -> dict:
  """Unprefixed: the last update; first_iter/: the first (on-policy: its ratio is exactly 1); iter<k>/:
  every update when there are several. All under the policy's `prefix`."""
  metrics = dict(per_iter[-1])
  metrics.update({f"first_iter/{k}": v for k, v in per_iter[0].items()})
  if len(per_iter) > 1:
    metrics.update({f"iter{i}/{k}": v for i, m in enumerate(per_iter) for k, v in m.items()})
  metrics["skipped"] = jnp.max(jnp.stack([m["skipped"] for m in per_iter]))
  return {prefix + k: v for k, v in metrics.items()}


def _select(full_state, like_state):
  """The entries of `full_state` at the paths of `like_state`."""
  flat = dict(nnx.to_flat_state(full_state))
  return nnx.from_flat_state([(p, flat[p]) for p, _ in nnx.to_flat_state(like_state)])


def train(config, workdir: str) -> dict:
  """Trains until config.train.num_steps; SIGTERM / Ctrl-C save a checkpoint and return.

  Returns {"step", "last" (the last step's scalars), "stopped_by" (signal name or None)}.
  """
  os.makedirs(workdir, exist_ok=True)
  quiet_library_logs()
  num_steps = config.train.num_steps
  saved = saved_steps(workdir)
  if saved and saved[-1] >= num_steps:
    logging.info("already complete: %s holds step %d of %d; raise --config.train.num_steps to train further",
                 os.path.join(workdir, "checkpoints"), saved[-1], num_steps)
    return {"step": saved[-1], "last": {}, "stopped_by": None}
  trainer = Trainer(config, workdir)
  # Rows of steps after the restored one are redone by this run: drop them, no duplicates.
  trainer.writer.drop_rows_after(trainer.step_index)
  progress = Progress(num_steps, trainer.step_index)
  last, stopped_by = {}, None
  try:
    with StopSignal() as stop:
      if trainer.step_index < num_steps:
        logging.info("step %d/%d: compiling the rollout and update programs (the first step takes longer)",
                     trainer.step_index + 1, num_steps)
      while trainer.step_index < num_steps:
        last = trainer.step()
        logging.info("%s", progress.line(trainer.step_index, last))
        trainer.save()
        if config.eval.interval and trainer.step_index % config.eval.interval == 0:
          evaluate_lib.run_eval(trainer.run, Policies.of_run(trainer.run, trainer.params, trainer.dit_params),
                               trainer.writer, trainer.step_index)
        if stop:
          stopped_by = stop.received
          logging.warning("stopping at step %d on %s", trainer.step_index, stopped_by)
          break
      trainer.save(force=True)
  finally:
    trainer.close()
  logging.info("%s", progress.summary(trainer.step_index, trainer.checkpointer.directory, stopped_by))
  return {"step": trainer.step_index, "last": last, "stopped_by": stopped_by}
