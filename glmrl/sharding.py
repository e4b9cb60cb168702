"""Logical axis names of parameters and their mapping onto the device mesh.

Every parameter is annotated with one logical name per dimension, e.g.
`nnx.Param(w, out_sharding=("embed", "mlp"))`. The rules below map logical
names onto the mesh axes `data`, `fsdp`, `tensor`; a name without a rule (or
`None`) is replicated.
"""

import contextlib
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

# Logical names used by the models.
EMBED = "embed"        # model (residual stream) width
MLP = "mlp"            # feed-forward hidden width
HEADS = "heads"        # query heads x head_dim, flattened
KV = "kv"              # key/value heads x head_dim, flattened
VOCAB = "vocab"        # output / input vocabulary
CONV_IN = "conv_in"    # convolution input channels
CONV_OUT = "conv_out"  # convolution output channels

# Default logical -> mesh axis rules (FSDP over the residual width, tensor
# parallelism over heads, MLP and vocabulary).
DEFAULT_RULES = (
    (EMBED, "fsdp"),
    (MLP, "tensor"),
    (HEADS, "tensor"),
    (KV, "tensor"),
    (VOCAB, "tensor"),
    (CONV_IN, None),
    (CONV_OUT, "fsdp"),
)

MESH_AXES = ("data", "fsdp", "tensor")
# Rollout / batch dimensions are split over both data-parallel axes.
BATCH_AXES = ("data", "fsdp")


def mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
  """Resolves the single -1 ("the rest") and checks the product equals num_devices."""
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh (data={data}, fsdp={fsdp}, tensor={tensor}): at most one axis may be -1")
  known = 1
  for s in sizes:
    if s != -1:
      if s < 1:
        raise ValueError(f"mesh axis size {s} must be >= 1 or -1")
      known *= s
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"mesh (data={data}, fsdp={fsdp}, tensor={tensor}) does not divide {num_devices} devices")
    sizes[sizes.index(-1)] = num_devices // known
  if sizes[0] * sizes[1] * sizes[2] != num_devices:
    raise ValueError(f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} != {num_devices} devices")
  return tuple(sizes)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None):
  """A ("data", "fsdp", "tensor") mesh over `devices` (default: all)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(data, fsdp, tensor, len(devices))
  # Auto axes: shardings are fixed at the jit boundaries and propagated by XLA inside.
  return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * 3)


def logical_to_spec(names, shape, mesh, rules=DEFAULT_RULES):
  """PartitionSpec for one array: each logical name mapped by `rules`.

  A dimension whose size does not divide over its mesh axis (tiny test models),
  or whose mesh axis is already used by another dimension, stays replicated.
  """
  table = dict(rules)
  used, spec = set(), []
  for name, size in zip(names or (None,) * len(shape), shape):
    axis = table.get(name) if name is not None else None
    if axis is None or axis in used or size % mesh.shape[axis]:
      spec.append(None)
    else:
      used.add(axis)
      spec.append(axis)
  return PartitionSpec(*spec)


def state_shardings(abstract_state, mesh, rules=DEFAULT_RULES):
  """NamedShardings for an nnx State (abstract or concrete) from its Params' `out_sharding` names."""
  def one(variable):
    names = variable.get_metadata().get("out_sharding")
    return variable.replace(
        NamedSharding(mesh, logical_to_spec(names, variable.shape, mesh, rules)))

  return jax.tree.map(one, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))


@dataclasses.dataclass(frozen=True)
class Undivided:
  """A parameter dimension that its rule maps onto a mesh axis its size does not divide, so it is replicated over
  that axis: each chip holds `extra_bytes` more of it than its share would be."""
  path: str
  shape: tuple
  name: str        # the dimension's logical name
  axis: str        # the mesh axis it would be split over
  axis_size: int
  extra_bytes: int


def undivided(abstract_state, mesh, rules=DEFAULT_RULES) -> list[Undivided]:
  """Every parameter of an nnx State (abstract or concrete) that `logical_to_spec` replicates over an axis because
  its size does not divide it (not because another of its dimensions already took the axis)."""
  table, out = dict(rules), []
  leaves = jax.tree_util.tree_leaves_with_path(abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  for path, variable in leaves:
    if not isinstance(variable, nnx.Variable):
      continue
    names = variable.get_metadata().get("out_sharding")
    spec = logical_to_spec(names, variable.shape, mesh, rules)
    split = math.prod(mesh.shape[a] for a in spec if a is not None)
    held = math.prod(variable.shape) * np.dtype(variable.dtype).itemsize // split  # bytes per chip as laid out
    for name, size, entry in zip(names or (None,) * len(variable.shape), variable.shape, spec):
      axis = table.get(name) if name is not None else None
      if axis is not None and entry is None and axis not in spec and size % mesh.shape[axis] \
          and not (out and out[-1].path == jax.tree_util.keystr(path) and out[-1].axis == axis):
        out.append(Undivided(jax.tree_util.keystr(path), tuple(variable.shape), name, axis, mesh.shape[axis],
                             held - held // mesh.shape[axis]))
  return out


# Replicated bytes per chip from which `warn_undivided` warns (below: an info line): the released VAE's last
# convolution (3 output channels, 14 KiB) never divides an fsdp axis, and nothing can be done about it.
WARN_UNDIVIDED_BYTES = 2**20


def warn_undivided(component: str, abstract_state, mesh, rules=DEFAULT_RULES) -> list[Undivided]:
  """One line naming `component`'s parameters that `undivided` finds and the bytes per chip they add (a warning from
  `WARN_UNDIVIDED_BYTES` on); returns them."""
  found = undivided(abstract_state, mesh, rules)
  if found:
    extra = sum(u.extra_bytes for u in found)
    named = "; ".join(f"{u.path} {list(u.shape)}: {u.name} over {u.axis}={u.axis_size}" for u in found[:3])
    more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
    logging.log(logging.WARNING if extra >= WARN_UNDIVIDED_BYTES else logging.INFO,
                "%s: %d parameter(s) have a dimension that does not divide its mesh axis and are replicated over it, "
                "%.2f MiB more per chip: %s%s", component, len(found), extra / 2**20, named, more)
  return found


# Where the AR sampler reads the generator's weights (config.rollout.ar_weights): "update", the update's FSDP
# layout (every decoded token gathers them over fsdp); "gathered", resharded once per rollout without the fsdp
# split (tensor-parallel over `tensor`, whole on every data x fsdp device; nothing to gather per token).
ROLLOUT_WEIGHTS = ("update", "gathered")


def without_fsdp(sharding: NamedSharding) -> NamedSharding:
  """`sharding` with its `fsdp` split dropped (that dimension replicated over fsdp); other axes kept."""
  def drop(entry):
    if entry == "fsdp":
      return None
    if isinstance(entry, tuple):
      kept = tuple(a for a in entry if a != "fsdp")
      return kept if len(kept) > 1 else (kept[0] if kept else None)
    return entry
  return NamedSharding(sharding.mesh, PartitionSpec(*(drop(e) for e in sharding.spec)))


def gathered_shardings(tree):
  """The `without_fsdp` sharding of every (abstract or concrete) array of `tree`."""
  return jax.tree.map(lambda x: without_fsdp(x.sharding), tree)


def batch_devices(mesh) -> int:
  """Devices a batch axis splits over: data x fsdp."""
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES if a in mesh.axis_names]))


def constrain_batch(x: jax.Array, batch_axis: int = 0) -> jax.Array:
  """`x` with its batch axis split over data x fsdp, inside a `jax.set_mesh` context (else as is).

  Activations carry this between layers: left to propagation alone, XLA may replicate the batch and
  split a feature axis the way the weights are split (re-gathering the batch at every micro-batch,
  or holding every sample's 1024^2 decoder activations on each chip).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.manual_axes:  # inside `per_device_samples`: each shard is already one device's samples
    return x
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  spec = [None] * x.ndim
  spec[batch_axis] = axes
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def per_device_samples(fn, replicated, batched_B):
  """`fn(replicated, batched_B)` run on each device's own rows of `batched_B` (leading axis over data x fsdp),
  `replicated` gathered whole onto every device, inside a `jax.set_mesh` context (else, or inside another
  `shard_map`, `fn` on the whole batch). Rows the batch devices do not divide are padded with zeros to a multiple
  of them and the padding's results dropped: a device's share is then at most one row more, its memory that of
  its own rows. For per-sample work XLA's sharding propagation spreads over chips: the VAE decode of one 1024^2
  sample per chip needs 5.56 GiB of temporaries per v5p chip as one GSPMD program with its weights FSDP-split
  (10.76 by bands of rows), 0.98 GiB as each chip's own (bench/decoder_memory_tpu.py). A tensor axis's devices
  each run their group's rows whole."""
  mesh = jax.sharding.get_abstract_mesh()
  axes = () if mesh.empty or mesh.manual_axes else tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  if not axes:
    return fn(replicated, batched_B)
  rows = jax.tree.leaves(batched_B)[0].shape[0]
  pad = -rows % int(np.prod([mesh.shape[a] for a in axes]))
  if pad:
    batched_B = jax.tree.map(lambda x: jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)), batched_B)
  # Every mesh axis manual: with the tensor axis left to XLA (even of size 1) the VAE decode took 7.08 GiB.
  out_B = jax.shard_map(fn, in_specs=(PartitionSpec(), PartitionSpec(axes)), out_specs=PartitionSpec(axes))(
      replicated, batched_B)
  return jax.tree.map(lambda y: y[:rows], out_B) if pad else out_B


def use_mesh(mesh):
  """The context under which jitted calls trace with `mesh` as the activations' mesh (no-op for None)."""
  return jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()


def put(x, sharding: NamedSharding) -> jax.Array:
  """`x` placed on `sharding`, also when the mesh spans several processes.

  A host value (or an array on this process's devices) is the same on every process (the data pipeline is
  deterministic), so each builds its own devices' shards from it (`make_array_from_callback`). An array that
  already spans several processes (a slice of a rollout) is resharded on the devices by `device_put`: no
  process can read it whole. A single process uses device_put. PRNG key arrays travel as their key data.
  """
  if sharding.is_fully_addressable or (isinstance(x, jax.Array) and not x.is_fully_addressable):
    return jax.device_put(x, sharding)
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(put(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def to_host(x) -> np.ndarray:
  """The whole value of a (possibly multi-process) array as numpy on every process."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)
