"""`python main.py --mode=compile --config.compile.topology=v5p-64` (or `h100-8`): does the run fit that target?

Builds the run abstractly on the target's devices (no weights, no TPU or GPU: `glmrl.programs.topology`), with its
plan resolved for the target's platform and memory budget (`glmrl.programs.budget`), compiles each program of a
training step for it, and writes `<workdir>/compile_report.json` and `<workdir>/compile_report.md`. A program the
compiler cannot fit is reported (`"fits": false`, the program and its error), not raised; XLA:GPU compiles a
program larger than the GPU, so the verdict is always the report's: the step's peak against the budget.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import tempfile
import time

import jax
from absl import logging

from glmrl import sharding as sharding_lib
from glmrl.programs import abstract as abstract_lib
from glmrl.programs import budget as budget_lib
from glmrl.programs import report as report_lib
from glmrl.programs import topology as topology_lib
from glmrl.errors import UserError

REPORT_JSON = "compile_report.json"
REPORT_TABLE = "compile_report.md"


def _mesh(config, devices):
  m = config.mesh
  try:
    return sharding_lib.make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
  except ValueError as e:
    raise UserError(f"config.mesh on {len(devices)} chips: {e}") from None


def compile_report(config) -> dict:
  """The report of `config` on `config.compile.topology` (see the module doc)."""
  slice_ = topology_lib.parse(config.compile.topology)
  budget = budget_lib.of(slice_.chip)
  mesh = _mesh(config, topology_lib.devices(slice_))
  if config.data.mode != "t2i":
    raise UserError("--mode=compile covers text-to-image runs (config.data.mode='t2i'); image-to-image adds the "
                    "condition images' DiT cache, which it does not lower yet")
  run = abstract_lib.build(config, mesh, slice_.chip.platform, hbm_bytes=budget.bytes)
  for choice in run.choices:
    logging.info("%s", choice.line())
  config = run.config
  state = run.resident_bytes()
  resident = sum(state.values())
  undivided = [{"component": name, **dataclasses.asdict(u), "shape": list(u.shape)}
               for name, (_, params) in run.models.items() for u in sharding_lib.warn_undivided(name, params, mesh)]
  flops = report_lib.step_flops(run.plan, run.layout, ar_param_count=abstract_lib.generator_params(run),
                                dit_param_count=abstract_lib.num_params(run.models["dit"][1]))
  entries, fits = {}, True
  for name, builder in _chosen(abstract_lib.builders(run), config.compile.programs).items():
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):  # the activations' batch constraints (`sharding.constrain_batch`) read it
      program = builder(run)
    if isinstance(program, str):
      entries[name] = {"error": program}
      continue
    try:
      entries[name] = program_report(program, resident, flops.get(name), slice_)
    except Exception as e:  # pylint: disable=broad-except  # XLA reports an over-full HBM as a compile error
      message = str(e).splitlines()[0] if str(e) else type(e).__name__
      entries[name] = {"error": message[:500], "fits": False}
      fits = False
      logging.warning("%s does not compile for %s: %s", name, slice_.name, message)
      continue
    logging.info("compiled %s for %s in %.0f s: peak %.1f GiB per chip", name, slice_.name,
                 time.perf_counter() - t0, entries[name]["peak_bytes_per_chip"] / 2**30)
  peak = max((e["peak_bytes_per_chip"] for e in entries.values() if "peak_bytes_per_chip" in e), default=resident)
  fits = fits and peak <= budget.bytes
  total_flops = sum(flops.values())
  where = ({"libtpu_topology": slice_.topology_name} if slice_.chip.platform == "tpu" else
           {"gpu": topology_lib.GPU_MODELS[slice_.chip.name].name, "gpu_topology": slice_.shape,
            "nodes": slice_.nodes})
  return {
      "topology": slice_.name, "platform": slice_.chip.platform, **where, "chips": slice_.chips,
      "mesh": {k: int(v) for k, v in mesh.shape.items()}, "hbm_bytes_per_chip": slice_.chip.hbm_bytes,
      "memory_budget": budget.report(peak), "fits": fits,
      "programs": entries, "state_bytes_per_chip": state, "peak_bytes_per_chip": int(peak),
      # Parameters replicated over a mesh axis their dimension does not divide (`sharding.undivided`).
      "undivided_params": undivided,
      "step_flops": total_flops,
      "estimated_step_seconds": total_flops / (slice_.chips * slice_.chip.peak_bf16_flops * report_lib.MFU_ASSUMPTION),
      "mfu_assumption": report_lib.MFU_ASSUMPTION,
      "roofline_step_seconds": sum(e.get("roofline_seconds", 0.0) for e in entries.values()),
      "trainable_params": abstract_lib.num_params(run.trained()),
      "auto": {c.key: {"value": c.value, "why": c.why} for c in run.choices},
      **({"programs_compiled": list(entries)} if config.compile.programs.strip(", ") else {}),
  }


def _chosen(builders: dict, names: str) -> dict:
  """The builders `config.compile.programs` names ("" or only commas: all of them); UserError for another name."""
  chosen = [n.strip() for n in names.split(",") if n.strip()]
  unknown = [n for n in chosen if n not in builders]
  if unknown:
    raise UserError(f"config.compile.programs={names!r}: this run has no program {', '.join(map(repr, unknown))}; "
                    f"its programs are {list(builders)}")
  return {n: b for n, b in builders.items() if not chosen or n in chosen}


# XLA:GPU compiling without a GPU has no autotuner to choose a Triton GEMM's tiles and falls back on a default
# that some float32 products refuse (`Couldn't find output tile sizes that satisfy hlo`: the tiny LoRA update's
# rank-4 products, HPS' image tower). A program refused that way is compiled again with its GEMMs on cuBLAS, which a
# GPU's autotuner may also pick; the entry names the option.
_GPU_TILE_ERROR = "Couldn't find output tile sizes"
_GPU_WITHOUT_TRITON_GEMMS = {"xla_gpu_enable_triton_gemm": False}


def program_report(program, resident: int, flops: float | None, slice_) -> dict:
  """The report entry of a program compiled for `slice_`; one run as consecutive parts (a tuple of lowerings)
  gets one entry for them all (`report.consecutive_entry`)."""
  parts = program.lowered if isinstance(program.lowered, tuple) else (program.lowered,)
  part_flops = flops if len(parts) == 1 else None  # FLOP formulas are per program, never per part
  entries = []
  for part in parts:
    options = {}
    try:
      compiled, hlo_text = compile_with_text(part)
    except Exception as e:  # pylint: disable=broad-except  # only XLA:GPU's tiling refusal is retried
      if slice_.chip.platform != "gpu" or _GPU_TILE_ERROR not in str(e):
        raise
      logging.info("%s: XLA:GPU found no Triton GEMM tiling without a GPU; compiling its GEMMs on cuBLAS",
                   program.name)
      options = _GPU_WITHOUT_TRITON_GEMMS
      compiled, hlo_text = compile_with_text(part, options)
    entry = report_lib.program_entry(program, compiled, hlo_text, resident, part_flops, slice_.chip, slice_.chips,
                                     slice_.devices_per_node if slice_.nodes > 1 else None)
    entries.append({**entry, "compiler_options": options} if options else entry)
  entry = report_lib.consecutive_entry(entries)
  options = {k: v for e in entries for k, v in e.get("compiler_options", {}).items()}
  return {**entry, "compiler_options": options} if options else entry


def compile_with_text(lowered, options: dict | None = None) -> tuple:
  """(compiled, its optimized HLO text), compiled with XLA `options`. The text comes from XLA's dump:
  `compiled.as_text()` re-parses the module and fails on some TPU programs (an async-update's operands)."""
  with tempfile.TemporaryDirectory() as dump:
    compiled = lowered.compile(compiler_options={**(options or {}), "xla_dump_to": dump, "xla_dump_hlo_as_text": True})
    texts = sorted(glob.glob(os.path.join(dump, "*after_optimizations.txt")), key=os.path.getsize)
    if not texts:
      raise RuntimeError(f"XLA wrote no optimized HLO into {dump}")
    with open(texts[-1]) as f:
      return compiled, f.read()


def compile(config, workdir: str) -> dict:  # pylint: disable=redefined-builtin  # the mode's name
  """`--mode=compile`: writes the report and its table into `workdir`; returns the report."""
  report = compile_report(config)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, REPORT_JSON), "w") as f:
    json.dump(report, f, indent=2)
  table = report_lib.table(report)
  with open(os.path.join(workdir, REPORT_TABLE), "w") as f:
    f.write(table + "\n")
  logging.info("%s\nwrote %s", table, os.path.join(workdir, REPORT_JSON))
  return report
