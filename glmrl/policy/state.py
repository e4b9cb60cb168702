"""One trained policy's state, built by one function for the run and for `--mode=compile`.

`build_state` splits the policy's model into what trains (its LoRA adapters, or its parameters under full
fine-tuning) and what stays frozen, and for training adds the optimizer, its state and the KL reference.
The run builds it from loaded weights; the compile mode from abstract ones (ShapeDtypeStructs carrying the
run's shardings), through the same steps, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from glmrl import sharding as sharding_lib
from glmrl.checkpoint.fingerprint import fingerprint
from glmrl.models import lora as lora_lib
from glmrl.models.init_rngs import InitRngs
from glmrl.policy import accumulate
from glmrl.policy import ema as ema_lib
from glmrl.policy import optimizer as optimizer_lib
from glmrl.policy.base import Policy


@dataclasses.dataclass
class PolicyState:
  """A policy's model split for training, and (when built to train) its optimizer and reference.

  `trainable`: the adapters (LoRA) or the trained parameters; `frozen`: the rest of the model (the base
  under LoRA). `reference`: a copy of the initial `trainable` when the KL term needs one and the policy
  has no adapters to switch off (None otherwise). `ema`: the float32 moving average of `trainable` when its
  settings keep one (`glmrl.policy.ema`; None otherwise). The Trainer replaces `trainable` and `opt_state`
  after each update (the update donates them), and `ema` after each step it is due.
  """
  policy: Policy
  graphdef: object
  trainable: nnx.State
  frozen: nnx.State
  lora: lora_lib.LoraConfig
  tx: object = None
  schedule: object = None
  opt_state: object = None
  reference: nnx.State | None = None
  ema: nnx.State | None = None
  ema_settings: ema_lib.EmaSettings = ema_lib.EmaSettings()

  @property
  def name(self) -> str:
    return self.policy.name

  def model_params(self, trainable=None) -> tuple:
    """The states the model merges from (the pipeline's `ar_params` / `dit_params`): (trainable, frozen)."""
    return (self.trainable if trainable is None else trainable, self.frozen)

  def checkpoint_params(self, trainable=None) -> nnx.State:
    """What a checkpoint holds of the policy: its whole model (the paths of a converted checkpoint, so it
    exports as one), or under LoRA its adapters alone."""
    trainable = self.trainable if trainable is None else trainable
    return trainable if self.lora.enabled else nnx.merge_state(trainable, self.frozen)

  def checkpoint_items(self) -> dict:
    """The policy's items of a training checkpoint by name (`policy.saved`): its params (`checkpoint_params`),
    optimizer state and, where kept, moving average (in the params item's layout: eval, generate and export read
    it alike). Abstract for an abstract state."""
    saved = self.policy.saved
    items = {saved.params: self.checkpoint_params(), saved.opt_state: self.opt_state}
    if self.ema is not None:
      items[saved.ema] = self.checkpoint_params(self.ema)
    return items

  def trainable_of(self, saved) -> nnx.State:
    """The trained state in a checkpoint's params (`checkpoint_params`' output)."""
    if self.lora.enabled:
      return saved
    flat = dict(nnx.to_flat_state(saved))
    return nnx.from_flat_state([(p, flat[p]) for p, _ in nnx.to_flat_state(self.trainable)])

  def jit_update(self, update, spec):
    """The policy module's `update` jitted for this state (`accumulate.jit_update`)."""
    shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
    return accumulate.jit_update(update, self.graphdef, spec=spec, tx=self.tx, schedule=self.schedule,
                                 param_shardings=shardings(self.trainable), opt_shardings=shardings(self.opt_state))

  def ema_params(self) -> nnx.State:
    """The moving average in the trained parameters' dtypes (what a model runs with)."""
    return ema_lib.as_params(self.ema, self.trainable)

  def update_ema(self, after: str, rollout_step: int) -> None:
    """Folds the current parameters into the moving average at moment `after` ("rollout": rollout step
    `rollout_step`, 1-based, has made its updates; "update": an optimizer step has been taken) when due, its decay
    indexed by the optimizer's own step count."""
    if self.ema is not None and self.ema_settings.due(after, rollout_step):
      self.ema = ema_lib.update(self.ema, self.trainable, optimizer_lib.update_count(self.opt_state),
                                self.ema_settings)

  def adapters_record(self) -> dict | None:
    """What a LoRA policy's checkpoints record of its adapters and their base (`check_adapters`); None
    for full fine-tuning. The base is named by its folder (or preset and seed) and a fingerprint of its
    weights (`glmrl.checkpoint.fingerprint`), so adapters never resume onto another base."""
    if not self.lora.enabled:
      return None
    config = self.policy.config  # the run's, which the policy was bound to
    source = os.path.abspath(config.model.checkpoint_dir) if config.model.checkpoint_dir else \
        f"random preset {config.model.preset!r}, seed {config.seed}, {config.model.param_dtype}"
    return {"rank": self.lora.rank, "alpha": self.lora.alpha, "targets": list(self.lora.targets),
            "base": {"checkpoint_dir": source, "fingerprint": fingerprint(self.frozen)}}


def placed(abstract_state, mesh):
  """`abstract_state` (ShapeDtypeStruct leaves) carrying the shardings the run's rules give it."""
  shardings = sharding_lib.state_shardings(abstract_state, mesh)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings)


def build_state(policy: Policy, config, model: tuple, mesh, *, abstract: bool = False,
                train: bool = True) -> PolicyState:
  """The state of `policy` on its `model` ((graphdef, state) of the component it trains).

  `abstract`: `model`'s state holds ShapeDtypeStructs with the run's shardings (`--mode=compile`), and so
  does the result. `train`: with the optimizer, its state and the KL reference (evaluation and generation
  need none of them).
  """
  settings = policy.settings
  graphdef, state = model
  lora = settings.lora
  if lora.enabled:
    rngs = lambda: InitRngs(jax.random.fold_in(jax.random.key(config.seed), policy.salt))
    if abstract:
      with_adapters = nnx.eval_shape(lambda s: lora_lib.apply_lora(nnx.merge(graphdef, s), lora, rngs()), state)
      graphdef, trainable, frozen = nnx.split(with_adapters, lora_lib.LoraParam, ...)
      trainable, frozen = placed(trainable, mesh), placed(frozen, mesh)
    else:
      model_ = nnx.merge(graphdef, state)
      lora_lib.apply_lora(model_, lora, rngs())
      graphdef, trainable, frozen = nnx.split(model_, lora_lib.LoraParam, ...)
      # B = 0: the model computes exactly what the base does.
      trainable = jax.device_put(trainable, sharding_lib.state_shardings(trainable, mesh))
    logging.info("%s LoRA rank %d (alpha %g) on %d layers: %d trainable parameters", policy.name, lora.rank,
                 lora.alpha, len(jax.tree.leaves(trainable)) // 2, num_params(trainable))
  else:
    graphdef, trainable, frozen = nnx.split(nnx.merge(graphdef, state), policy.full_filter, ...)
  out = PolicyState(policy, graphdef, trainable, frozen, lora)
  if not train:
    return out
  # The schedule counts updates: num_iterations of them per rollout step.
  out.tx, out.schedule = optimizer_lib.make_optimizer(settings.optim, config.train.num_steps,
                                                      settings.num_iterations)
  out.opt_state = _optimizer_state(out.tx, trainable, mesh, abstract)
  # The frozen reference policy: a copy of the initial parameters, only when the KL term (or the loss, DGPO's) reads
  # it; with LoRA
  # none (the update turns the adapters off instead: no second copy of any weight).
  if (settings.beta > 0 or policy.contrasts_reference) and not lora.enabled:
    out.reference = trainable if abstract else jax.tree.map(jnp.copy, trainable)
  if settings.ema.enabled:
    out.ema_settings = settings.ema
    out.ema = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=a.sharding),
                           trainable) if abstract else ema_lib.init(trainable)
  return out


def _optimizer_state(tx, trainable, mesh, abstract: bool):
  """Optimizer state, float32 whatever the parameter dtype (bfloat16 params get a float32 master copy and
  float32 AdamW moments). jit gives zeros_like outputs no sharding of their own, so each moment / master
  leaf is placed like its parameter explicitly (step counters replicated)."""
  init = functools.partial(optimizer_lib.init, tx)
  shardings = optimizer_lib.state_shardings(jax.eval_shape(init, trainable), trainable, mesh)
  if abstract:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        jax.eval_shape(init, trainable), shardings)
  return jax.jit(init, out_shardings=shardings)(trainable)


def num_params(state) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))
