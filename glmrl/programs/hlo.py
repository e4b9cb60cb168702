"""What a compiled program moves between chips and to and from HBM, read from its optimized HLO text.

XLA's cost analysis counts a loop's body once (with everything outside it) and says nothing of
collectives; the optimized HLO says both. Each collective's bytes per chip follow the ring model over its replica group of n chips (the
traffic into one chip): all-gather (n - 1)/n of its result, reduce-scatter (n - 1) times its result
(the shard), all-reduce 2 (n - 1)/n of its operand, all-to-all (n - 1)/n, collective-permute all of
it. On GPUs of several nodes, the `network` share of those bytes is that of the collectives whose replica groups
(or permute pairs) hold GPUs of different nodes. A computation's bytes are its own collectives' plus those of every computation it calls (fusions,
calls, async wrappers; a while loop's body times its known trip count), so the entry computation's
total is the program's. `loops` are its outermost while loops: the per-iteration bytes of a decode loop
are what each generated token moves.

HBM bytes (`hbm`) follow XLA's own model, per instruction outside fusions: what it reads of its operands
and writes of its result, arrays in another memory space (`S(1)`, TPU's on-chip VMEM) not counted. A
fusion reads of each operand what its fused computation uses: only the slices when the operand is only
sliced (a layer's weights out of the stacked ones), nothing when it is updated in place; a
dynamic-update-slice, fused or not, writes only its update; an asynchronous collective reads its operand and
writes its result once (in its start). Loops multiply as for the collectives, so a
decode loop's bytes per iteration are one token's.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

# Bytes per element of HLO's element types (pred is stored as a byte).
_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1,
                "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e3m4": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
                "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+(?:fn|fnuz)?)?)\[([\d,]*)\]")
_ARRAY_LAYOUT = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+(?:fn|fnuz)?)?)\[([\d,]*)\](\{[^{}]*\})?")
_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|branch_computations|called_computations)=(?:\{([^}]*)\}|%?([\w.\-]+))")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONSTANT = re.compile(r"^\s*%?([\w.\-]+)\s*=\s*[su]32\[\]\S*\s+constant\((-?\d+)\)")
_BOUND = re.compile(r"^\s*ROOT\s.*\bcompare\(%?([\w.\-]+),\s*%?([\w.\-]+)\),\s*direction=LT")


@dataclasses.dataclass
class Loop:
  """One while loop of the entry computation: bytes per chip moved per iteration, collectives per iteration
  (by kind), and its trip count when XLA knows it."""
  name: str
  trip_count: int | None
  bytes_per_iteration: float
  collectives_per_iteration: dict


@dataclasses.dataclass
class Traffic:
  """A program's collective traffic per chip: `outside` = the bytes outside its outermost while loops, `loops`
  those loops, `total` everything (loops times their trip counts; an unknown count counts as 1)."""
  outside: float
  loops: list
  total: float

  def main_loop(self) -> Loop | None:
    """The outermost loop that moves the most bytes in all (iterations x bytes per iteration: the decode loop,
    the denoising steps, the micro-batches), of equals the one of the most iterations. Not the most iterations
    alone: a decoder of 10 denoising steps also runs the VAE by 16 bands of rows."""
    return max(self.loops, key=lambda l: ((l.trip_count or 1) * l.bytes_per_iteration, l.trip_count or 1),
               default=None)


def array_bytes(shape_text: str) -> list[float]:
  """Bytes of each array in an HLO shape (`bf16[4,8]{1,0}` or a tuple of them), in order."""
  out = []
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype not in _DTYPE_BYTES:
      continue
    out.append(_DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d))
  return out


def hbm_array_bytes(shape_text: str) -> list[float]:
  """`array_bytes`, with 0 for an array placed in another memory space than HBM (a layout's `S(n)`, n > 0)."""
  out = []
  for dtype, dims, layout in _ARRAY_LAYOUT.findall(shape_text):
    if dtype not in _DTYPE_BYTES:
      continue
    space = re.search(r"S\((\d+)\)", layout or "")
    on_hbm = not space or space.group(1) == "0"
    out.append(_DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d) if on_hbm else 0.0)
  return out


def _callees(rest: str) -> list[str]:
  """The computations an instruction names (`calls=%f`, `branch_computations={%a, %b}`, ...)."""
  return [c.strip().lstrip("%") for braced, single in _CALLS.findall(rest)
          for c in (braced.split(",") if braced else [single]) if c.strip()]


def group_size(attributes: str, devices: int) -> int:
  """Chips per replica group (`groups`' first; all `devices` when the groups are empty or absent)."""
  return max(len(groups(attributes, devices)[0]), 1)


def groups(attributes: str, devices: int) -> list[list[int]]:
  """The device ids of each replica group (`{{0,1},{2,3}}`, iota `[2,4]<=[8]` or `[2,4]<=[4,2]T(1,0)`, mesh axes
  `mesh['x'=4,'y'=2] {'x'}`), or of each collective-permute's source-target pair; one group of all `devices`
  when they are empty or absent."""
  m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attributes)
  if m:
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1))]
  m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\))\))?\s*\{([^}]*)\}", attributes)
  if m:
    axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
    inside = set(re.findall(r"'([^']+)'", m.group(3)))
    ids = _iota(m.group(2)) if m.group(2) else np.arange(math.prod(int(n) for _, n in axes))
    ids = np.asarray(ids).reshape([int(n) for _, n in axes])
    order = [i for i, (a, _) in enumerate(axes) if a not in inside] + [i for i, (a, _) in enumerate(axes) if a in inside]
    size = math.prod(int(n) for a, n in axes if a in inside)
    return ids.transpose(order).reshape(-1, size).tolist()
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=(\[[\d,]+\](?:T\([\d,]+\))?)", attributes)
  if m:
    return _iota(m.group(3)).reshape(int(m.group(1)), int(m.group(2))).tolist()
  m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)+)\}", attributes)
  if m:
    found = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    if any(found):
      return found
  return [list(range(devices))]


def _iota(text: str):
  """The device ids of an iota list `[2,8]` or `[2,8]T(1,0)`: arange over the dims, transposed, flattened."""
  m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text.strip())
  if not m:
    raise ValueError(f"unreadable iota device list {text!r}")
  dims = [int(d) for d in m.group(1).split(",")]
  ids = np.arange(math.prod(dims)).reshape(dims)
  if m.group(2):
    ids = ids.transpose([int(d) for d in m.group(2).split(",")])
  return ids.reshape(-1)


def crosses_nodes(attributes: str, devices: int, devices_per_node: int | None) -> bool:
  """Whether a collective's groups hold devices of different nodes (`devices_per_node` consecutive ids each)."""
  if not devices_per_node or devices_per_node >= devices:
    return False
  return any(len({d // devices_per_node for d in group}) > 1 for group in groups(attributes, devices))


def collective_bytes(opcode: str, shape_text: str, attributes: str, devices: int) -> float:
  """Bytes per chip one collective moves (the ring model; see the module doc)."""
  kind = opcode.removesuffix("-start")
  arrays = array_bytes(shape_text)
  if not arrays:
    return 0.0
  n = group_size(attributes, devices)
  if n <= 1 and kind != "collective-permute":
    return 0.0
  if opcode.endswith("-start") and kind in ("all-gather", "collective-permute") and len(arrays) > 1:
    # An async start's result is (operand(s), result(s)[, context]): the results are the second half.
    size = sum(arrays[len(arrays) // 2:]) if kind == "all-gather" else arrays[1]
  else:
    size = sum(arrays)
  if kind == "all-gather":
    return size * (n - 1) / n
  if kind == "reduce-scatter":
    return size * (n - 1)
  if kind == "all-reduce":
    return 2 * size * (n - 1) / n
  if kind == "all-to-all":
    return size * (n - 1) / n
  return size  # collective-permute


@dataclasses.dataclass
class _Computation:
  own: dict = dataclasses.field(default_factory=dict)  # collective key -> (kind, bytes per chip, crosses nodes)
  calls: list = dataclasses.field(default_factory=list)   # names of the computations it calls (not loops)
  whiles: list = dataclasses.field(default_factory=list)  # (instruction name, body, condition, trip or None)
  constants: dict = dataclasses.field(default_factory=dict)  # scalar integer constants by name
  bound: tuple | None = None  # a condition's ROOT compare(a, b) direction=LT operands
  instructions: list = dataclasses.field(default_factory=list)  # (name, shape, opcode, operands, rest, root)
  shapes: dict = dataclasses.field(default_factory=dict)  # instruction name -> its shape text
  top_calls: list = dataclasses.field(default_factory=list)  # computations run as code, not fused (call, ...)


def _parse(text: str, devices: int, devices_per_node: int | None) -> tuple[dict, str | None]:
  comps, entry, current = {}, None, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = comps.setdefault(header.group(2), _Computation())
      if header.group(1):
        entry = header.group(2)
      continue
    if current is None:
      continue
    constant = _CONSTANT.match(line)
    if constant:
      current.constants[constant.group(1)] = int(constant.group(2))
    bound = _BOUND.match(line)
    if bound:
      current.bound = bound.groups()
    ins = _INSTRUCTION.match(line)
    if not ins:
      continue
    name, shape, opcode, rest = ins.groups()
    current.shapes[name] = shape
    current.instructions.append((name, shape, opcode, _OPERAND.findall(rest.split(")", 1)[0]), rest,
                                 line.lstrip().startswith("ROOT")))
    if opcode in ("call", "conditional", "async-start"):
      current.top_calls.extend(_callees(rest))
    if opcode.endswith("-done") or opcode == "async-update":
      continue  # the start counted the transfer and followed the wrapped computation
    kind = opcode.removesuffix("-start")
    if kind in _COLLECTIVES:
      # TPU's async collective fusions repeat one collective (one channel_id) in their start, continuation
      # and done computations: it is one transfer.
      channel = re.search(r"\bchannel_id=(\d+)", rest)
      key = ("channel", channel.group(1)) if channel else (id(current), name)
      current.own[key] = (kind, collective_bytes(opcode, shape, rest, devices),
                          crosses_nodes(rest, devices, devices_per_node))
    if opcode == "while":
      body, cond = (re.search(rf"\b{k}=%?([\w.\-]+)", rest) for k in ("body", "condition"))
      trip = _TRIP.search(rest)
      current.whiles.append((name, body.group(1) if body else None, cond.group(1) if cond else None,
                             int(trip.group(1)) if trip else None))
      continue
    current.calls.extend(_callees(rest))
  return comps, entry


def _trip_count(comps: dict, cond: str | None, known: int | None) -> int | None:
  """XLA's known trip count, else the constant bound of a `counter < N` condition: lax.scan and fori_loop
  count from 0, so N iterations."""
  if known is not None or cond not in comps or comps[cond].bound is None:
    return known
  _, rhs = comps[cond].bound
  return comps[cond].constants.get(rhs)


def _collectives(comps: dict, name: str, memo: dict) -> dict:
  """The collectives one run of computation `name` issues outside its loops (with those of the computations it
  calls), by key."""
  if name in memo:
    return memo[name]
  memo[name] = {}  # a cycle (none in valid HLO) counts once
  comp = comps.get(name)
  if comp is None:
    return memo[name]
  out = dict(comp.own)
  for callee in comp.calls:
    out.update(_collectives(comps, callee, memo))
  memo[name] = out
  return out


def _collective_totals(comps: dict, name: str, memo: dict, network: bool = False) -> tuple[float, dict]:
  """(bytes, collective counts by kind) of one run of computation `name` outside its loops (`memo`:
  `_collectives`'); `network`: only the collectives that cross nodes."""
  total, counts = 0.0, {}
  for kind, b, crosses in _collectives(comps, name, memo).values():
    if network and not crosses:
      continue
    total += b
    counts[kind] = counts.get(kind, 0) + 1
  return total, counts


def _totals(comps: dict, name: str, own) -> tuple[float, dict]:
  """(bytes, counts by kind) of one run of computation `name` with everything it calls: `own(name)` outside its
  loops, plus its loops (and theirs) times their trip counts."""
  total, counts = own(name)
  counts = dict(counts)
  for comp in _reachable(comps, name):
    for _, body, cond, trip in comps[comp].whiles:
      if body:
        k = _trip_count(comps, cond, trip) or 1
        b, c = _totals(comps, body, own)
        total += k * b
        for kind, v in c.items():
          counts[kind] = counts.get(kind, 0) + k * v
  return total, counts


def _reachable(comps: dict, name: str) -> list:
  """`name` and the computations it calls other than through a loop (where its loops can sit)."""
  seen, stack = [], [name]
  while stack:
    n = stack.pop()
    if n in seen or n not in comps:
      continue
    seen.append(n)
    stack.extend(comps[n].calls)
  return seen


def _traffic(comps: dict, entry: str | None, own) -> Traffic:
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  total, _ = _totals(comps, entry, own)
  loops = []
  for comp in _reachable(comps, entry):
    for name, body, cond, trip in comps[comp].whiles:
      b, c = _totals(comps, body, own) if body else (0.0, {})
      loops.append(Loop(name, _trip_count(comps, cond, trip), b, c))
  outside = total - sum(l.bytes_per_iteration * (l.trip_count or 1) for l in loops)
  return Traffic(outside=outside, loops=loops, total=total)


# Instructions that move no HBM bytes themselves (views, tuples, control; a loop or call is counted through the
# computations it runs).
_NO_BYTES = frozenset(("parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all", "partition-id",
                       "replica-id", "while", "call", "conditional", "opt-barrier", "add-dependency", "domain",
                       "async-start", "async-update"))  # collectives' and copies' -start and -done: in `_hbm_own`
_SLICES = ("slice", "dynamic-slice", "gather")


def _fused_reads(comps: dict, fused: _Computation, index: int, operand_bytes: float) -> float:
  """Bytes a fusion reads of its operand `index` (`operand_bytes` whole): the slices of it that its fused
  computation takes when it only slices it (through bitcasts and nested fusions), nothing when it only updates
  it in place."""
  read, whole = _slices_read(comps, fused, index, operand_bytes)
  return operand_bytes if whole else min(read, operand_bytes)


def _slices_read(comps: dict, fused: _Computation, index: int, operand_bytes: float) -> tuple[float, bool]:
  """(bytes sliced out of parameter `index` of `fused`, whether it is used whole: read by anything but a slice
  or an in-place update, or returned through bitcasts)."""
  param = next((n for n, _, op, _, rest, _ in fused.instructions if op == "parameter" and
                re.match(rf"{index}\)", rest)), None)
  if param is None or not operand_bytes:
    return 0.0, bool(operand_bytes)
  names, read = [param], 0.0
  while names:
    current = names.pop()
    for n, shape, op, operands, rest, root in fused.instructions:
      if n == current and root:
        return read, True  # the value (a view of the parameter) leaves the fusion
      if current not in operands:
        continue
      callee = re.search(r"\bcalls=%?([\w.\-]+)", rest) if op == "fusion" else None
      if op == "bitcast":
        names.append(n)
      elif callee and callee.group(1) in comps:
        for i, o in enumerate(operands):
          if o == current:
            nested_read, nested_whole = _slices_read(comps, comps[callee.group(1)], i, operand_bytes)
            read += nested_read
            if nested_whole:
              names.append(n)  # the nested fusion passes the parameter on: follow its result here
      elif op in _SLICES and operands[0] == current:
        read += sum(array_bytes(shape))
      elif op == "dynamic-update-slice" and operands[0] == current:
        continue  # written in place: the update is the write
      else:
        return read, True
  return read, False


def _fusion_written(fused: _Computation, shape: str) -> float:
  root = next((i for i in fused.instructions if i[5]), None)
  if root is None:
    return sum(hbm_array_bytes(shape))
  _, _, opcode, operands, _, _ = root
  if opcode == "dynamic-update-slice":
    return sum(array_bytes(fused.shapes.get(operands[1], "")))
  if opcode == "tuple":
    out = hbm_array_bytes(shape)
    for i, element in enumerate(operands[:len(out)]):
      producer = next((x for x in fused.instructions if x[0] == element), None)
      if producer is not None and producer[2] == "dynamic-update-slice" and out[i]:
        out[i] = sum(array_bytes(fused.shapes.get(producer[3][1], "")))
    return sum(out)
  return sum(hbm_array_bytes(shape))


def _hbm_own(comps: dict, name: str, memo: dict) -> float:
  """HBM bytes per chip of one run of computation `name` outside its loops, with the computations it runs as
  code (call, conditional, async)."""
  if name in memo:
    return memo[name]
  memo[name] = 0.0
  comp = comps.get(name)
  if comp is None:
    return 0.0
  total = 0.0
  for _, shape, opcode, operands, rest, _ in comp.instructions:
    if opcode in _NO_BYTES:
      continue
    reads = [sum(hbm_array_bytes(comp.shapes.get(o, ""))) for o in operands]
    if opcode == "fusion":
      callee = re.search(r"\bcalls=%?([\w.\-]+)", rest)
      fused = comps.get(callee.group(1)) if callee else None
      if fused is not None:
        total += sum(_fused_reads(comps, fused, i, b) for i, b in enumerate(reads)) + _fusion_written(fused, shape)
        continue
    if opcode in _SLICES:
      out = sum(hbm_array_bytes(shape))
      total += out + out + sum(reads[1:])  # the slice read, its result written, the indices
      continue
    if opcode == "dynamic-update-slice":
      total += 2 * reads[1]  # the update read and written in place
      continue
    if opcode == "copy-start":
      total += reads[0] if reads else 0.0
      continue
    if opcode.endswith("-start"):
      # An async collective's start returns (operands, results[, context]): it reads the operands and writes the
      # results once; its done moves nothing more.
      arrays = hbm_array_bytes(shape)
      operand_arrays = len(operands)
      total += sum(reads) + sum(arrays[operand_arrays:2 * operand_arrays] if len(arrays) > operand_arrays else arrays)
      continue
    if opcode.endswith("-done"):
      continue
    total += sum(reads) + sum(hbm_array_bytes(shape))
  for callee in comp.top_calls:
    total += _hbm_own(comps, callee, memo)
  memo[name] = total
  return total


def custom_calls(text: str) -> list[str]:
  """The custom-call targets an optimized HLO module calls (library kernels: `__cudnn$fmhaSoftmax`,
  `__cublas$lt$matmul`, ...), sorted."""
  return sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))


def collective_ops(text: str) -> dict:
  """How many instructions of each collective opcode the module holds, as the backend emits them (async pairs by
  their `-start`: XLA:GPU's NCCL collectives are `all-gather-start` / `all-reduce-start` ...)."""
  counts = {}
  for line in text.splitlines():
    ins = _INSTRUCTION.match(line)
    if ins and ins.group(3).removesuffix("-start") in _COLLECTIVES and not ins.group(3).endswith("-done"):
      counts[ins.group(3)] = counts.get(ins.group(3), 0) + 1
  return dict(sorted(counts.items()))


def analyse(text: str, devices: int, devices_per_node: int | None = None) -> tuple[Traffic, Traffic, Traffic]:
  """(collective traffic, HBM bytes, the collective traffic that crosses nodes) per chip of an optimized HLO
  module's text on `devices` chips, nodes of `devices_per_node` (None: one node), from one parse (see the module
  doc)."""
  comps, entry = _parse(text, devices, devices_per_node)
  collective_memo, hbm_memo = {}, {}
  return (_traffic(comps, entry, lambda name: _collective_totals(comps, name, collective_memo)),
          _traffic(comps, entry, lambda name: (_hbm_own(comps, name, hbm_memo), {})),
          _traffic(comps, entry, lambda name: _collective_totals(comps, name, collective_memo, network=True)))
