"""What a compiled program moves between chips, read from its optimized HLO text (`compiled.as_text()`).

XLA's cost analysis counts a loop's body once and says nothing of collectives; the optimized HLO says
both. Each collective's bytes per chip follow the ring model over its replica group of n chips (the
traffic into one chip): all-gather (n - 1)/n of its result, reduce-scatter (n - 1) times its result
(the shard), all-reduce 2 (n - 1)/n of its operand, all-to-all (n - 1)/n, collective-permute all of
it. A computation's bytes are its own collectives' plus those of every computation it calls (fusions,
calls, async wrappers; a while loop's body times its known trip count), so the entry computation's
total is the program's. `loops` are its outermost while loops: the per-iteration bytes of a decode loop
are what each generated token moves.
"""

from __future__ import annotations

import dataclasses
import math
import re

# Bytes per element of HLO's element types (pred is stored as a byte).
_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1,
                "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e3m4": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
                "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+(?:fn|fnuz)?)?)\[([\d,]*)\]")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|branch_computations|called_computations)=\{?([%\w.\-, ]+)\}?")
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
    """The outermost loop of the most iterations (the decode loop, the denoising steps, the micro-batches),
    of those the one that moves the most bytes."""
    return max(self.loops, key=lambda l: (l.trip_count or 1, l.bytes_per_iteration), default=None)


def array_bytes(shape_text: str) -> list[float]:
  """Bytes of each array in an HLO shape (`bf16[4,8]{1,0}` or a tuple of them), in order."""
  out = []
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype not in _DTYPE_BYTES:
      continue
    out.append(_DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d))
  return out


def group_size(attributes: str, devices: int) -> int:
  """Chips per replica group: `replica_groups={{0,1},{2,3}}`, iota `[2,4]<=[8]`, or mesh axes
  `mesh['x'=4,'y'=2] {'x'}`; all `devices` when the groups are empty or absent."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
  if m:
    sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))}
    return math.prod(sizes[a] for a in re.findall(r"'([^']+)'", m.group(2))) or 1
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes)
  if m:
    return int(m.group(2))
  m = re.search(r"replica_groups=\{(\{[\d,]*\})", attributes)
  if m:
    return max(len([x for x in m.group(1).strip("{}").split(",") if x]), 1)
  return devices


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
  own: dict = dataclasses.field(default_factory=dict)  # collective key -> (kind, bytes per chip)
  calls: list = dataclasses.field(default_factory=list)   # names of the computations it calls (not loops)
  whiles: list = dataclasses.field(default_factory=list)  # (instruction name, body, condition, trip or None)
  constants: dict = dataclasses.field(default_factory=dict)  # scalar integer constants by name
  bound: tuple | None = None  # a condition's ROOT compare(a, b) direction=LT operands


def _parse(text: str, devices: int) -> tuple[dict, str | None]:
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
    if opcode.endswith("-done") or opcode == "async-update":
      continue  # the start counted the transfer and followed the wrapped computation
    kind = opcode.removesuffix("-start")
    if kind in _COLLECTIVES:
      # TPU's async collective fusions repeat one collective (one channel_id) in their start, continuation
      # and done computations: it is one transfer.
      channel = re.search(r"\bchannel_id=(\d+)", rest)
      key = ("channel", channel.group(1)) if channel else (id(current), name)
      current.own[key] = (kind, collective_bytes(opcode, shape, rest, devices))
    if opcode == "while":
      body, cond = (re.search(rf"\b{k}=%?([\w.\-]+)", rest) for k in ("body", "condition"))
      trip = _TRIP.search(rest)
      current.whiles.append((name, body.group(1) if body else None, cond.group(1) if cond else None,
                             int(trip.group(1)) if trip else None))
      continue
    for group in _CALLS.findall(rest):
      for callee in group.split(","):
        callee = callee.strip().lstrip("%")
        if callee:
          current.calls.append(callee)
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


def _totals(comps: dict, name: str, memo: dict) -> tuple[float, dict]:
  """(bytes, collective counts by kind) of one run of computation `name` with everything it calls, its loops
  (and theirs) times their trip counts (`memo`: `_collectives`')."""
  total, counts = 0.0, {}
  for kind, b in _collectives(comps, name, memo).values():
    total += b
    counts[kind] = counts.get(kind, 0) + 1
  for comp in _reachable(comps, name):
    for _, body, cond, trip in comps[comp].whiles:
      if body:
        k = _trip_count(comps, cond, trip) or 1
        b, c = _totals(comps, body, memo)
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


def traffic(text: str, devices: int) -> Traffic:
  """The collective traffic per chip of an optimized HLO module's text on `devices` chips."""
  comps, entry = _parse(text, devices)
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  memo = {}
  total, _ = _totals(comps, entry, memo)
  loops = []
  for comp in _reachable(comps, entry):
    for name, body, cond, trip in comps[comp].whiles:
      b, c = _totals(comps, body, memo) if body else (0.0, {})
      loops.append(Loop(name, _trip_count(comps, cond, trip), b, c))
  outside = total - sum(l.bytes_per_iteration * (l.trip_count or 1) for l in loops)
  return Traffic(outside=outside, loops=loops, total=total)
