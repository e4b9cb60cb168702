"""A random init as two programs, its draws batched in the first: the same values, a fraction of the compilation.

A module's init draws each parameter from its own key (`InitRngs`: `fold_in(key, n)`, then e.g. a truncated normal
of the parameter's shape). Traced as written, each draw is its own Threefry hash and transform in the compiled
program, and XLA:CPU spends most of an init's compilation on them: the tiny generator's, DiT's, VAE's and glyph
encoder's inits on 8 host devices compile in 8.2 s together, in 0.7 s with every draw replaced by a constant.

`split(fn, *args)` traces `fn` (`jax.make_jaxpr`, nested `jit`s inlined but the draws below) and returns two
functions of the same arguments:
- `draw(*args)`: every set of independent draws made at once, as stacked arrays: the key derivations
  (`random_fold_in`) of one depth in one vmapped call; jax.random's uniforms and truncated normals (`_FLAT`) of one
  dtype and the same bounds in one vmapped call over flat shapes padded to the largest, and other bits
  (`random_bits`) of one width likewise; calls of other jitted draw functions of one shape in one vmapped call.
- `place(*args, drawn)`: the rest of `fn` (each parameter sliced from its batch, transformed, scaled, cast).

Two programs, because within one XLA fuses a batch's whole computation into every slice that reads it: each
parameter would still compile its own copy. The values are bit for bit `fn`'s (tests/models/test_init_draws.py,
test_glm_image.py): vmap gives each member what it gives alone; a flat draw's first n values are those of any shape
of n elements (JAX's partitionable Threefry, the default since JAX 0.5, hashes each element's row-major index, and
these transforms are elementwise); and no batch ends in a scaling by a constant (a normal's sqrt(2)), which XLA
folds into the initializer's own scale when both are in one program (one rounding instead of two). The four tiny
inits above: 3.7 s. Only draws of at most `MAX_BATCHED` elements are batched, and a batch padded past
`MAX_PADDED` is split by size: `draw`'s output is replicated on every device, which must stay small next to a
full-size model; larger draws are made in `place`, on their own shardings. A primitive or function name this
module does not know (a JAX upgrade's) leaves its draws unbatched, never other values.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

# Draws up to this many elements are batched (a 256 x 256 weight); larger ones are made alone.
MAX_BATCHED = 1 << 16
# Flat draws of different sizes share one call while, padded to the largest, they hold at most this many elements.
MAX_PADDED = 1 << 20
_FOLD_IN, _BITS, _JIT = "random_fold_in", "random_bits", ("jit", "pjit")


@dataclasses.dataclass(frozen=True)
class _Ref:
  """Output `index` of node `node` (an index into the flat node list)."""
  node: int
  index: int


@dataclasses.dataclass(frozen=True)
class _Arg:
  """The function's `index`-th (flat) argument."""
  index: int


@dataclasses.dataclass
class _Node:
  eqn: jex_core.JaxprEqn
  inputs: list  # _Ref, _Arg, or a value (a literal or a constant)
  kind: str  # "fold_in", "bits", "flat", "call" (a batched draw: see _kind), or ""
  depth: int = 0  # draws on the longest path from the arguments


@dataclasses.dataclass(frozen=True)
class _Batch:
  kind: str
  members: tuple[int, ...]  # node indices, one depth


def split(fn, *args):
  """(draw, place) of `fn` (arrays -> a pytree of arrays) at `args`' shapes: `place(*args, draw(*args))` is
  `fn(*args)` (see the module docstring)."""
  closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
  nodes, outs = _flatten(closed.jaxpr, closed.consts, [_Arg(i) for i in range(len(jax.tree.leaves(args)))])
  first = _ancestors(nodes, [i for i, n in enumerate(nodes) if n.kind])
  steps = _first_steps(nodes, first)
  batches = [s for s in steps if isinstance(s, _Batch)]
  member_of = {i: (b, j) for b, batch in enumerate(batches) for j, i in enumerate(batch.members)}
  # What `place` reads of the first program's values other than the batches: outputs of its nodes that are not draws.
  later = [i for i in range(len(nodes)) if i not in first]
  read_later = [r for i in later for r in nodes[i].inputs] + outs
  passed = sorted({r for r in read_later if isinstance(r, _Ref) and r.node in first and r.node not in member_of},
                  key=lambda r: (r.node, r.index))

  def draw(*args):
    values = _Values(nodes, jax.tree.leaves(args))
    stacked = []
    for step in steps:
      if isinstance(step, _Batch):
        stacked.append(_DRAW[step.kind]([nodes[i] for i in step.members], values.read))
        for j, i in enumerate(step.members):
          values.set_outputs(i, _member(step.kind, stacked[-1], j, nodes[i]))
      else:
        values.run(step)
    return stacked, [values.read(r) for r in passed]

  def place(*args):
    *args, (stacked, passed_values) = args
    values = _Values(nodes, jax.tree.leaves(args))
    for i, (b, j) in member_of.items():
      values.set_outputs(i, _member(batches[b].kind, stacked[b], j, nodes[i]))
    values.values.update(zip(passed, passed_values))
    for i in later:
      values.run(i)
    return jax.tree.unflatten(jax.tree.structure(out_shape), [values.read(r) for r in outs])

  draw.__name__, place.__name__ = "init_draws", "init"  # the compiled programs' names
  return draw, place


def _flatten(jaxpr, consts, args) -> tuple[list[_Node], list]:
  """The equations of `jaxpr` with every nested `jit` inlined but the draw calls (`_kind`), inputs first, and the
  refs (or values) of its outputs."""
  nodes: list[_Node] = []

  def walk(jaxpr, consts, args) -> list:
    env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args))

    def read(atom):
      return atom.val if isinstance(atom, jex_core.Literal) else env[atom]

    for eqn in jaxpr.eqns:
      inputs = [read(a) for a in eqn.invars]
      kind = _kind(eqn)
      if eqn.primitive.name in _JIT and not kind:
        outs = walk(eqn.params["jaxpr"].jaxpr, eqn.params["jaxpr"].consts, inputs)
      else:
        nodes.append(_Node(eqn, inputs, kind))
        outs = [_Ref(len(nodes) - 1, i) for i in range(len(eqn.outvars))]
      env.update(zip(eqn.outvars, outs))
    return [read(a) for a in jaxpr.outvars]

  outs = walk(jaxpr, consts, args)
  for node in nodes:  # a draw's outputs are one level deeper than its inputs
    node.depth = max((nodes[r.node].depth + bool(nodes[r.node].kind)
                      for r in node.inputs if isinstance(r, _Ref)), default=0)
  return nodes, outs


def _kind(eqn) -> str:
  """What batched draw `eqn` is: "fold_in" (of a scalar key), "bits" (of a scalar key, at most MAX_BATCHED
  elements), "flat" (a `_FLAT` function's call of at most MAX_BATCHED elements), "call" (another jitted function of
  a scalar key whose draws are at most MAX_BATCHED elements each), or "" (none)."""
  name = eqn.primitive.name
  scalar_key = any(_is_key(v.aval) and v.aval.shape == () for v in eqn.invars)
  if name == _FOLD_IN:
    return "fold_in" if scalar_key else ""
  if name == _BITS:
    return "bits" if scalar_key and eqn.outvars[0].aval.size <= MAX_BATCHED else ""
  if name in _JIT and scalar_key and eqn.params["name"] in _FLAT and eqn.outvars[0].aval.size <= MAX_BATCHED:
    return "flat"
  if name in _JIT and scalar_key and not _ends_in_a_scaling(eqn.params["jaxpr"].jaxpr):
    sizes = _draw_sizes(eqn.params["jaxpr"].jaxpr)
    if sizes and max(sizes) <= MAX_BATCHED:
      return "call"
  return ""


# jax.random's jitted draws whose values are elementwise functions of their bits, by the name of their jit (inputs:
# the key, then the scalars below): drawn flat, one call for every shape of a size class, as the public function.
_FLAT = {
    "_uniform": lambda key, shape, dtype, minval, maxval: jax.random.uniform(key, shape, dtype, minval, maxval),
    "_truncated_normal": lambda key, shape, dtype, lower, upper: jax.random.truncated_normal(key, lower, upper,
                                                                                             shape, dtype),
}


def _ends_in_a_scaling(jaxpr) -> bool:
  """Whether `jaxpr`'s output is a product or quotient with a constant (e.g. jax.random's normal: sqrt(2) times
  an inverse erf). Such a call is not batched whole: in one program XLA folds that constant into the initializer's
  own scale (normal(key) * stddev, one rounding), which a batch's boundary would keep apart (two roundings)."""
  producers = {v: e for e in jaxpr.eqns for v in e.outvars}
  eqn = producers.get(jaxpr.outvars[0])
  if eqn is None:
    return False
  if eqn.primitive.name in _JIT:
    return _ends_in_a_scaling(eqn.params["jaxpr"].jaxpr)
  return eqn.primitive.name in ("mul", "div") and any(isinstance(a, jex_core.Literal) for a in eqn.invars)


def _draw_sizes(jaxpr) -> list[int]:
  """The sizes of the bits `jaxpr` draws, nested jits included."""
  sizes = []
  for e in jaxpr.eqns:
    if e.primitive.name == _BITS:
      sizes.append(e.outvars[0].aval.size)
    elif e.primitive.name in _JIT:
      sizes += _draw_sizes(e.params["jaxpr"].jaxpr)
  return sizes


def _is_key(aval) -> bool:
  return jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key)


def _ancestors(nodes: list[_Node], roots: list[int]) -> set[int]:
  """`roots` and every node they depend on."""
  seen, todo = set(), list(roots)
  while todo:
    i = todo.pop()
    if i not in seen:
      seen.add(i)
      todo += [r.node for r in nodes[i].inputs if isinstance(r, _Ref)]
  return seen


def _first_steps(nodes: list[_Node], first: set[int]) -> list:
  """The first program's nodes in an order it can run them: depth by depth, each depth's other nodes (in trace
  order), then its draws in batches."""
  by_depth = collections.defaultdict(list)
  for i in sorted(first):
    by_depth[nodes[i].depth].append(i)
  steps = []
  for depth in sorted(by_depth):
    batches = collections.defaultdict(list)
    for i in by_depth[depth]:
      if nodes[i].kind:
        batches[_batch_key(nodes[i])].append(i)
      else:
        steps.append(i)
    for key, members in batches.items():
      parts = _by_size(nodes, members) if key[0] in ("bits", "flat") else [members]
      steps += [_Batch(key[0], tuple(part)) for part in parts]
  return steps


def _batch_key(node: _Node) -> tuple:
  """Draws made in one call: fold-ins together; bits of one width, and one jax.random function's flat draws with the
  same dtype and static inputs, each split by size where needed (`_by_size`); calls of one jitted function (one
  jaxpr: one shape) with the same static inputs."""
  if node.kind == "fold_in":
    return ("fold_in",)
  if node.kind == "bits":
    return ("bits", node.eqn.params["bit_width"])
  if node.kind == "flat":
    aval = node.eqn.outvars[0].aval
    return ("flat", node.eqn.params["name"], aval.dtype, tuple(_static(x) for x in node.inputs))
  return ("call", id(node.eqn.params["jaxpr"]), tuple(_static(x) for x in node.inputs))


def _by_size(nodes: list[_Node], members: list[int]) -> list[list[int]]:
  """Flat draws of one batch key: in one call when, padded to the largest, they hold at most `MAX_PADDED` elements
  (the tiny VAE's truncated normals: 54 x 2304); else by powers of two of their size, each call at most twice its
  members' size."""
  sizes = {i: nodes[i].eqn.outvars[0].aval.size for i in members}
  if len(members) * max(sizes.values()) <= MAX_PADDED:
    return [members]
  classes = collections.defaultdict(list)
  for i in members:
    classes[(sizes[i] - 1).bit_length()].append(i)
  return list(classes.values())


def _static(x):
  """A call's scalar literal or constant, which members batched together share, as a hashable stand-in (a NumPy
  scalar's repr is exact); None for an input that varies between the members (a ref, an argument, or an array
  constant: stacked like the others)."""
  return None if isinstance(x, (_Ref, _Arg)) or getattr(x, "shape", ()) != () else repr(x)


class _Values:
  """The values of one program's run: nodes' outputs by ref, the arguments, literals and constants as themselves."""

  def __init__(self, nodes: list[_Node], args: list):
    self.nodes, self.args, self.values = nodes, args, {}

  def read(self, x):
    if isinstance(x, _Ref):
      return self.values[x]
    return self.args[x.index] if isinstance(x, _Arg) else x

  def set_outputs(self, i: int, outs) -> None:
    self.values.update((_Ref(i, k), v) for k, v in enumerate(outs))

  def run(self, i: int) -> None:
    eqn = self.nodes[i].eqn
    outs = eqn.primitive.bind(*map(self.read, self.nodes[i].inputs), **eqn.params)
    self.set_outputs(i, outs if eqn.primitive.multiple_results else [outs])


def _fold_in_all(members: list[_Node], read) -> list:
  keys = jnp.stack([read(m.inputs[0]) for m in members])
  data = jnp.stack([jnp.asarray(read(m.inputs[1]), jnp.uint32) for m in members])
  return [jax.vmap(jax.random.fold_in)(keys, data)]


def _bits_all(members: list[_Node], read) -> list:
  """Each member's key's bits of the class's largest size, flat (cut to each member's size by `_member`)."""
  width = members[0].eqn.params["bit_width"]
  size = max(m.eqn.outvars[0].aval.size for m in members)
  keys = jnp.stack([read(m.inputs[0]) for m in members])
  return [jax.vmap(lambda k: jax.random.bits(k, (size,), jnp.dtype(f"uint{width}")))(keys)]


def _call_all(members: list[_Node], read) -> list:
  """One jitted function's calls as one vmapped call."""
  return list(_vmapped(jex_core.jaxpr_as_fun(members[0].eqn.params["jaxpr"]), members, read))


def _flat_all(members: list[_Node], read) -> list:
  """One jax.random function's draws as one vmapped call over flat shapes of the largest member's size (cut to each
  member's size by `_member`)."""
  draw = _FLAT[members[0].eqn.params["name"]]
  dtype = members[0].eqn.outvars[0].aval.dtype
  size = max(m.eqn.outvars[0].aval.size for m in members)
  return [_vmapped(lambda key, *scalars: draw(key, (size,), dtype, *scalars), members, read)]


def _vmapped(fn, members: list[_Node], read):
  """`fn` of the members' inputs as one vmapped call: the inputs that vary between them stacked, the shared ones
  (`_static`) passed once."""
  varies = [_static(x) is None for x in members[0].inputs]
  columns = zip(*[[read(x) for x in m.inputs] for m in members])
  stacked = [jnp.stack(c) if v else c[0] for c, v in zip(columns, varies)]
  return jax.vmap(fn, in_axes=[0 if v else None for v in varies])(*stacked)


_DRAW = {"fold_in": _fold_in_all, "bits": _bits_all, "call": _call_all, "flat": _flat_all}


def _member(kind: str, stacked: list, j: int, node: _Node) -> list:
  """Member `j`'s outputs, from its batch's stacked outputs."""
  if kind in ("bits", "flat"):
    aval = node.eqn.outvars[0].aval
    return [stacked[0][j, :aval.size].reshape(aval.shape)]
  return [x[j] for x in stacked]
