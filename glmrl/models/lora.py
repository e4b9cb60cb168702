"""Low-rank adapters (LoRA) on the linear layers of our NNX models.

An adapted layer computes y = base(x) + (alpha / rank) * (x @ A) @ B with A [in, rank] and
B [rank, out]: the merged [in, out] delta is never built in the forward, and B starts at zero
so each adapted layer adds exactly zero until B is trained (`adapters_off` restores that).

Adapters attach in place: `apply_lora` gives each targeted `nnx.Linear` / `StackedLinear` two
`LoraParam` attributes (`lora_a`, `lora_b`) next to its `kernel` / `bias` and switches the
layer's class to a subclass whose `__call__` adds the low-rank update (the same trick as
`torch.nn.utils.parametrize`). Nothing is copied or re-parented, so the base weights keep
their exact paths (`text.layers.0.attn.q.kernel`), the adapters sit beside them
(`text.layers.0.attn.q.lora_a`), and nnx.split / merge rebuild the subclass from the graphdef.
`LoraParam` is an `nnx.Param`, so adapters shard, save and train like any parameter, and the
`LoraParam` / `BASE_PARAMS` filters separate the two.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.errors import UserError
from glmrl.models.ar.text import StackedLinear

# The AR text decoder's attention and MLP projections; the vision encoder, VQ and lm_head stay as released.
AR_TARGETS = (r"^text\.layers\.\d+\.attn\.(q|k|v|o)$", r"^text\.layers\.\d+\.mlp\.(gate_up|down)$")
# The DiT blocks' joint attention and MLP; AdaLN, embeddings and the in/out projections stay as released.
DIT_TARGETS = (r"^blocks\.\d+\.attn\.(q|k|v|out)$", r"^blocks\.\d+\.mlp\.(fc1|fc2)$")


# `config.lora.targets` names: a preset, else the value is itself a regex.
TARGET_PRESETS = {"ar": AR_TARGETS, "dit": DIT_TARGETS}


def target_patterns(targets: str) -> tuple[str, ...]:
  """The regexes of a `config.lora.targets` value: a preset's, or the value itself (checked to compile)."""
  if targets in TARGET_PRESETS:
    return TARGET_PRESETS[targets]
  if not isinstance(targets, str) or not targets:
    raise ValueError(f"lora targets={targets!r}: a preset {sorted(TARGET_PRESETS)} or a regex")
  try:
    re.compile(targets)
  except re.error as e:
    raise ValueError(f"lora targets={targets!r} is not a valid regex: {e}") from None
  return (targets,)


class LoraParam(nnx.Param):
  """An adapter matrix. `lora_b` carries the update's scale (alpha / rank) as `lora_scale` metadata, which
  travels with the state: the forward and `merge_lora` read that one number, never a config."""


# The base model's weights: every Param that is not an adapter.
BASE_PARAMS = nnx.All(nnx.Param, nnx.Not(LoraParam))


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """`rank` 0 turns adapters off. The update is scaled by `alpha / rank`; `targets` are regexes
  searched (re.search) in each linear layer's dotted module path, e.g. `text.layers.0.attn.q`."""
  rank: int = 0
  alpha: float = 0.0
  targets: tuple[str, ...] = AR_TARGETS

  def __post_init__(self):
    if isinstance(self.targets, list):  # from a config file; a tuple keeps the config hashable
      object.__setattr__(self, "targets", tuple(self.targets))
    if self.rank < 0:
      raise UserError(f"lora rank={self.rank} must be >= 0 (0: no adapters)")
    if self.rank == 0:
      return
    if not self.alpha > 0:
      raise UserError(f"lora alpha={self.alpha} must be > 0 with rank={self.rank} (the update is scaled by "
                      "alpha / rank)")
    if isinstance(self.targets, str) or not self.targets:
      raise UserError(f"lora targets={self.targets!r} must be a non-empty tuple of regexes")
    for pattern in self.targets:
      try:
        re.compile(pattern)
      except re.error as e:
        raise UserError(f"lora target {pattern!r} is not a valid regex: {e}") from None

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _scale(lora_b: LoraParam) -> float:
  return lora_b.get_metadata()["lora_scale"]


def _compute_dtype(layer, y: jax.Array):
  return y.dtype if layer.dtype is None else layer.dtype


@jax.custom_vjp
def _times_a(x_TxI: jax.Array, a_IxR: jax.Array) -> jax.Array:
  """x @ A, its gradient for A taken as [R, I] then transposed.

  XLA:CPU runs the dot of A's gradient in its natural [I, R] orientation (x^T dh: I skinny rows of R) about
  2.4x slower than the same contraction written [R, I] (dh^T x); the optimization barrier keeps XLA from folding
  the transpose back into the dot (`bench/decoder_update.py`). The values are the same contraction's."""
  return x_TxI @ a_IxR


def _times_a_fwd(x_TxI, a_IxR):
  return x_TxI @ a_IxR, (x_TxI, a_IxR)


def _times_a_bwd(residuals, dh_TxR):
  x_TxI, a_IxR = residuals
  da_RxI = jax.lax.optimization_barrier(dh_TxR.T @ x_TxI)
  return dh_TxR @ a_IxR.T, da_RxI.T


_times_a.defvjp(_times_a_fwd, _times_a_bwd)


def _low_rank(x_xI: jax.Array, lora_a: LoraParam, lora_b: LoraParam, dtype) -> jax.Array:
  """scale * (x @ A) @ B over rows flattened to 2-D, reshaped back: [..., O] (B [R, O]) or [..., J, O] (B [R, J, O]).

  With 3-D inputs the adapters' weight gradients (x^T dh, contracting batch and tokens) miss XLA:CPU's
  matrix-multiply path; as [T, I] @ [I, R] they take it (`bench/decoder_update.py`). Scaling the rank-R
  intermediate costs R, not O, multiplies per row."""
  lead = x_xI.shape[:-1]
  b = lora_b[...]
  x_TxI = x_xI.reshape(-1, x_xI.shape[-1]).astype(dtype)
  h_TxR = _times_a(x_TxI, lora_a[...].astype(dtype)) * jnp.asarray(_scale(lora_b), dtype)
  return (h_TxR @ b.reshape(b.shape[0], -1).astype(dtype)).reshape(*lead, *b.shape[1:])


class LoraLinear(nnx.Linear):
  """An nnx.Linear (kernel [I, O]) with lora_a [I, R] and lora_b [R, O]; made only by `apply_lora`."""

  def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
    y = super().__call__(inputs, out_sharding)
    return y + _low_rank(inputs, self.lora_a, self.lora_b, _compute_dtype(self, y)).astype(y.dtype)


class LoraStackedLinear(StackedLinear):
  """A StackedLinear (kernel [I, J, O]) with lora_a [I, R] and lora_b [R, J, O]: one adapter of the fused
  map, as on the released model's fused HF linear (`gate_up_proj`, one PEFT adapter with B [J*O, R])."""

  def __call__(self, x_BxLxI: jax.Array) -> jax.Array:
    y_BxLxJxO = super().__call__(x_BxLxI)
    delta_BxLxJxO = _low_rank(x_BxLxI, self.lora_a, self.lora_b, _compute_dtype(self, y_BxLxJxO))
    return y_BxLxJxO + delta_BxLxJxO.astype(y_BxLxJxO.dtype)


_ADAPTED = {nnx.Linear: LoraLinear, StackedLinear: LoraStackedLinear}


def _path_str(path) -> str:
  return ".".join(str(k) for k in path)


def _linear_layers(model: nnx.Module) -> list[tuple[str, nnx.Module]]:
  """(dotted path, layer) of every plain nnx.Linear / StackedLinear, adapted or not."""
  return [(_path_str(path), node) for path, node in nnx.iter_graph(model)
          if type(node) in _ADAPTED or type(node) in _ADAPTED.values()]


def _lora_uniform(key, shape, fan_in: int, dtype) -> jax.Array:
  # PEFT's default init of A: kaiming_uniform(a=sqrt(5)) over fan_in, i.e. U(-1/sqrt(I), 1/sqrt(I)).
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)


def _attach(layer: nnx.Module, cfg: LoraConfig, rngs: nnx.Rngs) -> None:
  kernel = layer.kernel[...]
  names = layer.kernel.get_metadata().get("out_sharding") or (None,) * kernel.ndim
  r = cfg.rank
  if isinstance(layer, StackedLinear):
    d_in, j, d_out = kernel.shape
    a_shape, a_names = (d_in, r), (names[0], None)
    b_shape, b_names = (r, j, d_out), (None, None, names[-1])
  else:
    d_in, d_out = kernel.shape
    a_shape, a_names = (d_in, r), (names[0], None)
    b_shape, b_names = (r, d_out), (None, names[-1])
  layer.lora_a = LoraParam(_lora_uniform(rngs.params(), a_shape, d_in, kernel.dtype), out_sharding=a_names)
  # B = 0: the adapted layer starts as the base layer, bit for bit.
  layer.lora_b = LoraParam(jnp.zeros(b_shape, kernel.dtype), out_sharding=b_names, lora_scale=cfg.scale)
  # Switching the class (rather than wrapping the layer) keeps kernel/bias at their paths; the
  # graphdef records the new class, so nnx.merge rebuilds adapted layers.
  layer.__class__ = _ADAPTED[type(layer)]


def apply_lora(model: nnx.Module, cfg: LoraConfig, rngs: nnx.Rngs) -> nnx.Module:
  """Adds adapters, in place, to every nnx.Linear / StackedLinear whose path matches a target; returns `model`.

  Call it where the model is built, e.g. `nnx.eval_shape(lambda: apply_lora(Model(cfg, rngs=...), ...))`
  and the same inside the jitted init, like the layers' own constructors. A is drawn from
  `rngs.params()` layer by layer in module-path order. A target regex that matches no linear
  layer, or a layer that already has adapters, is an error.
  """
  if not cfg.enabled:
    return model
  layers = _linear_layers(model)
  for pattern in cfg.targets:
    if not any(re.search(pattern, path) for path, _ in layers):
      sample = ", ".join(path for path, _ in layers[:8])
      raise UserError(f"lora target {pattern!r} matches no linear layer of {type(model).__name__} "
                      f"(linear layers: {sample}{', ...' if len(layers) > 8 else ''})")
  for path, layer in layers:
    if not any(re.search(pattern, path) for pattern in cfg.targets):
      continue
    if type(layer) in _ADAPTED.values():
      raise UserError(f"linear layer {path} already has lora adapters")
    _attach(layer, cfg, rngs)
  return model


def adapters_off(state: nnx.State) -> nnx.State:
  """`state` with every lora_b zeroed: the base model's function (the KL reference) from the same weights."""
  def off(path, variable):
    if isinstance(variable, LoraParam) and path[-1] == "lora_b":
      return variable.replace(jnp.zeros_like(variable[...]))
    return variable

  return nnx.map_state(off, state)


def merge_lora(state: nnx.State) -> nnx.State:
  """The base weights with each adapter's scaled delta added to its kernel (in float32, cast back),
  adapters dropped: a state for the unadapted model's graphdef (merged export)."""
  flat = dict(nnx.to_flat_state(state))
  out = {}
  for path, variable in flat.items():
    if isinstance(variable, LoraParam):
      continue
    if path[-1] == "kernel" and path[:-1] + ("lora_a",) in flat:
      a = flat[path[:-1] + ("lora_a",)][...].astype(jnp.float32)
      b_var = flat.get(path[:-1] + ("lora_b",))
      if b_var is None:
        raise ValueError(f"{_path_str(path[:-1])} has lora_a but no lora_b in the state")
      b = b_var[...].astype(jnp.float32)
      if b.ndim == 3:  # StackedLinear: a [I, R], b [R, J, O], kernel [I, J, O]
        delta = jnp.einsum("ir,rjo->ijo", a, b)
      else:
        delta = a @ b
      kernel = variable[...]
      variable = variable.replace((kernel.astype(jnp.float32) + _scale(b_var) * delta).astype(kernel.dtype))
    out[path] = variable
  orphans = [p for p, v in flat.items() if isinstance(v, LoraParam) and p[:-1] + ("kernel",) not in flat]
  if orphans:
    raise ValueError(f"adapters without their kernel in the state: {[_path_str(p) for p in orphans[:4]]}")
  return nnx.from_flat_state(out)


def count_lora_params(tree) -> int:
  """Number of adapter (trainable) weights in a Module or State, abstract (eval_shape) or concrete."""
  state = nnx.state(tree, LoraParam) if isinstance(tree, nnx.Module) else tree
  leaves = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  return sum(int(np.prod(v.shape)) for v in leaves if isinstance(v, LoraParam))
