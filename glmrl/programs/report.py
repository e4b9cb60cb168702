"""Per-chip bytes, FLOPs and traffic of a compiled step, and the report `--mode=compile` writes.

Peak per chip of a program = the run's resident state (every parameter, optimizer state and frozen
model, which stay in HBM across programs) + the program's temporaries + its outputs that do not
reuse a donated input + its arguments that are not resident state (batch inputs). The step's peak
is the largest program's. FLOPs come from formulas: XLA's cost analysis counts the body of a loop
(the DiT's denoising steps, the sampler's decode loop, the micro-batch scan) once. What crosses the
chip links and what moves to and from HBM come from the optimized HLO (`glmrl.programs.hlo`), per iteration
of the program's main loop and outside it. XLA's own count of HBM bytes (`bytes accessed`) is kept
beside them: it counts each loop body once, with the code outside it, so it is not one iteration's.

Roofline time of one call of a program with a main loop of T iterations: T x max(FLOPs per chip / T /
peak FLOP/s, HBM bytes per iteration / HBM bandwidth, link bytes per iteration / link bandwidth) +
max(HBM bytes outside the loop / HBM bandwidth, link bytes outside it / link bandwidth); without a loop,
the max of the three totals. On GPUs of several nodes, link time is the bytes of collectives within a node over
NVLink plus those of collectives that cross nodes (`network_bytes_*`) over the network's per-GPU bandwidth. The
step's roofline is the sum over programs of calls x that.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from glmrl.programs import hlo
from glmrl.policy import registry
from glmrl.policy.base import FlopCounts

MFU_ASSUMPTION = 0.4  # model FLOPs utilisation assumed for the step-time estimate


def bytes_per_chip(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (or arrays)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(tuple(leaf.shape)) if getattr(leaf, "sharding", None) else leaf.shape
    total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
  return int(total)


def step_flops(plan, layout, *, ar_param_count: int, dit_param_count: int) -> dict:
  """FLOPs of one training step by program of the run of `plan` (`glmrl.programs.plan.RunPlan`), from the standard
  dense-transformer formulas.

  AR: 2 N per token and forward (N = `ar_param_count`, the text decoder and head) plus causal attention
  2 L S^2 E per sequence (L layers, S tokens, E width). DiT: 2 N_dit per token plus 4 L T^2 E attention over its
  T tokens (image patches and glyph tokens) per image, step and CFG branch; the rollout's decode runs both branches
  at every step, at the decoding policy's steps and guidance when one decodes (one branch at guidance 1.0). The
  VAE decode (convolutions) is left out. Each trained policy counts its own update (`Policy.update_flops`).
  """
  config, configs, policies, request = plan.config, plan.configs, plan.policies, plan.request
  rows = config.data.prompts_per_step * request.grids_per_prompt
  images = config.data.prompts_per_step * request.images_per_prompt
  s = config.data.max_prompt_tokens + layout.num_new_tokens
  text, dit = configs.ar.text, configs.dit
  ar_forward = rows * (2 * ar_param_count * s + 2 * text.num_hidden_layers * s * s * text.hidden_size)
  t = (config.data.height // 16) * (config.data.width // 16) + config.data.max_glyph_tokens
  dit_width = dit.num_attention_heads * dit.attention_head_dim
  one_pass = 2 * dit_param_count * t + 4 * dit.num_layers * t * t * dit_width  # one image, one step, one branch
  leg = registry.decoding(policies)
  steps = leg.train_steps if leg is not None else config.sampling.dit_steps
  rollout_pass = one_pass if leg is not None and leg.guidance == 1.0 else 2 * one_pass
  out = {"ar_sampler": float(ar_forward), "decoder": float(images * steps * rollout_pass)}
  counts = FlopCounts(ar_forward=ar_forward, dit_pass=one_pass, images=images)
  out.update({policy.programs[1]: policy.update_flops(counts) for policy in policies.values()})
  return out


def xla_bytes_accessed(compiled) -> float | None:
  """XLA's `bytes accessed` of a compiled program per chip (each loop body counted once); None where XLA gives no
  cost analysis (a GPU program compiled without a GPU)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("bytes accessed", 0.0)) if cost else None


def _link_seconds(collective_bytes: float, network_bytes: float, chip) -> float:
  """Seconds of chip-to-chip traffic: within a node over its links, across nodes over the network."""
  if not network_bytes:
    return collective_bytes / chip.link_bandwidth
  return (collective_bytes - network_bytes) / chip.link_bandwidth + network_bytes / chip.network_bandwidth


def roofline(entry: dict, chip, chips: int) -> tuple[float, str]:
  """(seconds of one call, its binding term: "flops", "hbm" or "links") of a program's entry (see the module doc)."""
  flops = entry.get("flops", 0.0) / entry["calls_per_step"] / chips
  loop = entry.get("main_loop")
  trips = (loop or {}).get("trip_count") or 0
  network_total = entry.get("network_bytes_total", 0.0)
  if trips:
    link, hbm = loop["collective_bytes_per_iteration"], loop["hbm_bytes_per_iteration"]
    network = loop.get("network_bytes_per_iteration", 0.0)
    link_outside = entry["collective_bytes_total"] - trips * link
    hbm_outside = entry["hbm_bytes_total"] - trips * hbm
    terms = {"flops": flops / trips / chip.peak_bf16_flops, "hbm": hbm / chip.hbm_bandwidth,
             "links": _link_seconds(link, network, chip)}
    bound = max(terms, key=terms.get)
    outside = _link_seconds(link_outside, network_total - trips * network, chip)
    return trips * terms[bound] + max(hbm_outside / chip.hbm_bandwidth, outside), bound
  terms = {"flops": flops / chip.peak_bf16_flops, "hbm": entry["hbm_bytes_total"] / chip.hbm_bandwidth,
           "links": _link_seconds(entry["collective_bytes_total"], network_total, chip)}
  bound = max(terms, key=terms.get)
  return terms[bound], bound


def program_entry(program, compiled, hlo_text: str, resident_bytes: int, flops: float | None, chip,
                  chips: int, devices_per_node: int | None = None) -> dict:
  m = compiled.memory_analysis()
  state = sum(bytes_per_chip(t) for t in program.state_args)
  args, out, temp, alias = (int(m.argument_size_in_bytes), int(m.output_size_in_bytes),
                            int(m.temp_size_in_bytes), int(m.alias_size_in_bytes))
  peak = resident_bytes + temp + max(out - alias, 0) + max(args - state, 0)
  entry = {"argument_bytes": args, "output_bytes": out, "temp_bytes": temp, "alias_bytes": alias,
           "peak_bytes_per_chip": peak, "calls_per_step": program.calls,
           "xla_bytes_accessed": xla_bytes_accessed(compiled)}
  if flops is not None:
    entry["flops"] = float(flops)
  entry["custom_calls"], entry["collective_ops"] = hlo.custom_calls(hlo_text), hlo.collective_ops(hlo_text)
  traffic, memory, network = hlo.analyse(hlo_text, chips, devices_per_node)
  entry["collective_bytes_total"], entry["hbm_bytes_total"] = traffic.total, memory.total
  if devices_per_node and devices_per_node < chips:
    entry["network_bytes_total"] = network.total
  hbm_loop = memory.main_loop()  # by HBM bytes: a loop can do most of the work and move nothing between chips
  if hbm_loop is not None:
    loop = next(l for l in traffic.loops if l.name == hbm_loop.name)  # the same parse: the same loops
    entry["main_loop"] = {"trip_count": loop.trip_count, "collective_bytes_per_iteration": loop.bytes_per_iteration,
                          "collectives_per_iteration": loop.collectives_per_iteration,
                          "hbm_bytes_per_iteration": hbm_loop.bytes_per_iteration}
    if "network_bytes_total" in entry:
      entry["main_loop"]["network_bytes_per_iteration"] = next(
          l for l in network.loops if l.name == hbm_loop.name).bytes_per_iteration
  seconds, bound = roofline(entry, chip, chips)
  entry["roofline_seconds"], entry["roofline_bound"] = program.calls * seconds, bound
  return entry


def consecutive_entry(parts: list[dict]) -> dict:
  """The entry of a program run as consecutive parts (each part's `program_entry`, without FLOPs): arguments,
  outputs, bytes moved and roofline times summed, the largest part's temporaries (and its roofline's bound), and
  as peak the largest of each part's own peak plus the outputs of the parts before it, which stay live."""
  if len(parts) == 1:
    return parts[0]
  summed = ("argument_bytes", "output_bytes", "alias_bytes", "collective_bytes_total", "hbm_bytes_total",
            "roofline_seconds")
  entry = {key: sum(part[key] for part in parts) for key in summed}
  accessed = [part["xla_bytes_accessed"] for part in parts]
  entry["xla_bytes_accessed"] = None if None in accessed else sum(accessed)
  if "network_bytes_total" in parts[0]:
    entry["network_bytes_total"] = sum(part["network_bytes_total"] for part in parts)
  earlier, peak = 0, 0
  for part in parts:
    peak = max(peak, part["peak_bytes_per_chip"] + earlier)
    earlier += max(part["output_bytes"] - part["alias_bytes"], 0)
  longest = max(parts, key=lambda part: part["roofline_seconds"])
  entry["custom_calls"] = sorted({c for part in parts for c in part["custom_calls"]})
  entry["collective_ops"] = {}
  for part in parts:
    for op, n in part["collective_ops"].items():
      entry["collective_ops"][op] = entry["collective_ops"].get(op, 0) + n
  entry.update(temp_bytes=max(part["temp_bytes"] for part in parts), peak_bytes_per_chip=peak,
               calls_per_step=parts[0]["calls_per_step"], roofline_bound=longest["roofline_bound"], parts=len(parts))
  return entry


def human_bytes(v: float) -> str:
  """1536 -> '1.5 KiB'."""
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(v) < 1024 or unit == "GiB":
      return f"{v:,.1f} {unit}" if unit != "B" else f"{v:,.0f} B"
    v /= 1024
  return ""


def table(report: dict) -> str:
  """The report as a Markdown table (per-chip GiB), as compile_report.md and docs/reference/fits.md show it."""
  gib = lambda v: f"{v / 2**30:,.1f}"
  unit = "GPU" if report.get("platform") == "gpu" else "chip"
  chips = f"{report['chips']} {unit}s" if report["chips"] > 1 else f"1 {unit}"
  if report.get("gpu"):
    chips += f" {report['gpu']}" + (f", {report['nodes']} nodes" if report["nodes"] > 1 else "")
  hbm = report["hbm_bytes_per_chip"]
  budget = report.get("memory_budget", {})
  limit = budget.get("budget_bytes", hbm)
  over = [f"{name} {gib(p['peak_bytes_per_chip'] - limit)} GiB over" if "peak_bytes_per_chip" in p else
          f"{name} refused by the compiler" for name, p in report["programs"].items()
          if p.get("peak_bytes_per_chip", 0) > limit or p.get("fits") is False]
  verdict = "fits" if report["fits"] else "does not fit" + (f" ({'; '.join(over)})" if over else "")
  if budget.get("fits_with_raised_fraction"):
    verdict += f"; fits with XLA_PYTHON_CLIENT_MEM_FRACTION={budget['fraction_needed']:.2f}"
  if report.get("programs_compiled"):  # config.compile.programs named some: the verdict is theirs
    verdict += f" (compiled: {', '.join(report['programs_compiled'])} only)"
  peak = report["peak_bytes_per_chip"]
  if "allocator_fraction" in budget:
    source = "JAX's default" if budget["allocator_fraction_source"] == "default" else "as set"
    against = (f"{100 * peak / limit:.0f}% of the budget: {gib(limit)} GiB = the allocator's pool "
               f"({budget['allocator_fraction']:.2f} of HBM, {source}) less a {gib(budget['pool_reserve_bytes'])} "
               f"GiB reserve")
  else:
    against = f"{100 * peak / hbm:.0f}% of HBM"
  rows = [f"**{report['topology']}** ({chips}, {gib(hbm)} GiB HBM each): "
          f"{verdict}, peak {gib(peak)} GiB per {unit} ({against})", "",
          "| program | arguments | outputs | temporaries | aliased | peak per chip | TFLOPs | main loop x calls | "
          "HBM per iteration | chip links per iteration | chip links in all | roofline s (bound) |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for name, p in report["programs"].items():
    if "error" in p:
      rows.append(f"| {name} | {p['error']} | | | | | | | | | | |")
      continue
    flops = f"{p['flops'] / 1e12:,.0f}" if "flops" in p else ""
    loop = p.get("main_loop") or {}
    trips = f"{loop.get('trip_count') or '?'} x {p['calls_per_step']}" if loop else f"- x {p['calls_per_step']}"
    per_iter = human_bytes(loop["collective_bytes_per_iteration"]) if loop else ""
    hbm_iter = human_bytes(loop["hbm_bytes_per_iteration"]) if loop else human_bytes(p["hbm_bytes_total"])
    rows.append(f"| {name} | {gib(p['argument_bytes'])} | {gib(p['output_bytes'])} | {gib(p['temp_bytes'])} | "
                f"{gib(p['alias_bytes'])} | {gib(p['peak_bytes_per_chip'])} | {flops} | {trips} | {hbm_iter} | {per_iter} | "
                f"{human_bytes(p['collective_bytes_total'] * p['calls_per_step'])} | "
                f"{p['roofline_seconds']:,.2f} ({p['roofline_bound']}) |")
  state = report["state_bytes_per_chip"]
  attention = {name: [c for c in p.get("custom_calls", ()) if "fmha" in c] for name, p in report["programs"].items()}
  if any(attention.values()):
    rows += ["", "cuDNN attention kernels: " + "; ".join(f"{n} {', '.join(k)}" for n, k in attention.items() if k)]
  if report.get("auto"):
    rows += ["", "auto settings: " + "; ".join(f"{k} = {v['value']} ({v['why']})" for k, v in report["auto"].items())]
  rows += ["", "resident state per chip (GiB): " + ", ".join(f"{k} {gib(v)}" for k, v in state.items()),
           f"estimated step: {report['roofline_step_seconds']:.1f} s roofline (the programs' sum), "
           f"{report['estimated_step_seconds']:.1f} s at {report['mfu_assumption']:.0%} MFU"]
  return "\n".join(rows)
