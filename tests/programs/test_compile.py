"""--mode=compile: a step's programs compiled for a TPU slice from this CPU host (libtpu, no TPU).

The tiny config on v5e slices: the report as users get it from main.py, every optimizer-state leaf
sharded like its parameter, and the per-chip bytes of the sharded state halving when the chips double.
"""

import json
import os

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import glmrl  # noqa: F401,E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from glmrl.programs import compile_mode as mode_lib  # noqa: E402
from glmrl.programs import abstract, plan  # noqa: E402
from glmrl.programs import report as report_lib  # noqa: E402
from glmrl.programs import topology  # noqa: E402
from glmrl.errors import UserError  # noqa: E402
from glmrl.sampling import rollout_weights  # noqa: E402
from tests.cli import TIMEOUT_S, run_main  # noqa: E402
from tests.train.common import tiny_config  # noqa: E402


def test_main_writes_the_report_for_a_slice(tmp_path):
  # The decoupled recipe: every program of a step, the AR policy's and the decoder policy's, with the defaults:
  # `rollout.ar_weights=auto` picks "gathered" for this tiny run on v5e-8 (its generator copy fits a chip), and the
  # report says so. The update layout's decode loop (the generator gathered at every token) is counted in
  # tests/programs/test_hlo.py.
  result = run_main("--config=configs/glm_image_t2i_decoupled.py:tiny", "--mode=compile",
                    "--config.compile.topology=v5e-8", tmp_path=tmp_path, timeout=TIMEOUT_S)
  assert result.returncode == 0, (result.stderr + result.stdout)[-3000:]
  report = json.loads((tmp_path / "compile_report.json").read_text())
  assert report["topology"] == "v5e-8" and report["chips"] == 8 and report["fits"] is True
  assert report["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
  assert report["auto"]["model.dit_attention"] == {"value": "splash", "why": "Pallas flash attention on TPU"}
  gathered = report["auto"]["rollout.ar_weights"]
  assert gathered["value"] == "gathered" and "within 90% of 14.9 GiB" in gathered["why"]
  assert "model.dit_attention=auto -> 'splash'" in result.stderr
  assert "rollout.ar_weights=auto -> 'gathered'" in result.stderr
  # The tiny VAE's last convolution (3 output channels) does not divide fsdp=8: listed, and one info line names it.
  undivided = report["undivided_params"]
  assert undivided and {(u["component"], u["name"], u["axis"], u["axis_size"]) for u in undivided} == \
      {("vae", "conv_out", "fsdp", 8)} and all(u["extra_bytes"] > 0 for u in undivided)
  assert any(u["path"] == "['decoder']['conv_out']['kernel']" and u["shape"] == [3, 3, 8, 3] for u in undivided)
  assert f"vae: {len(undivided)} parameter(s) have a dimension that does not divide its mesh axis" in result.stderr
  assert set(report["programs"]) == {"ar_reshard", "ar_sampler", "decoder", "rewards", "update", "decoder_rewards",
                                     "decoder_update"}
  for name, p in report["programs"].items():
    assert 0 < p["peak_bytes_per_chip"] <= report["peak_bytes_per_chip"] < report["hbm_bytes_per_chip"], name
    assert p["argument_bytes"] > 0 and p["temp_bytes"] >= 0, name
  # Each update donates its params and optimizer state: its outputs reuse their buffers (the AR's params are
  # the larger part of the trained state; the DiT's adapters and moments are in the rest).
  assert report["programs"]["update"]["alias_bytes"] > 0 and report["programs"]["decoder_update"]["alias_bytes"] > 0
  assert report["programs"]["update"]["alias_bytes"] + report["programs"]["decoder_update"]["alias_bytes"] >= \
      report["state_bytes_per_chip"]["params"]
  assert report["programs"]["decoder_update"]["flops"] > 0
  assert "| decoder_update |" in (tmp_path / "compile_report.md").read_text()
  # Traffic from the optimized HLO: the generator is gathered once, by the reshard before the sampler, whose
  # decode loop (one iteration per token after the prefill) reads its whole copy and gathers nothing; the step's
  # roofline is the programs' sum.
  loop = report["programs"]["ar_sampler"]["main_loop"]
  assert loop["trip_count"] > 1 and loop["collectives_per_iteration"].get("all-gather", 0) == 0
  assert 0 < loop["hbm_bytes_per_iteration"] < report["programs"]["ar_sampler"]["hbm_bytes_total"]
  assert report["programs"]["ar_reshard"]["collective_bytes_total"] > 0
  seconds = [p["roofline_seconds"] for p in report["programs"].values()]
  assert all(s > 0 for s in seconds)
  assert report["roofline_step_seconds"] == pytest.approx(sum(seconds), rel=1e-12)
  assert "chip links per iteration" in (tmp_path / "compile_report.md").read_text()
  assert "HBM per iteration" in (tmp_path / "compile_report.md").read_text()


def test_the_table_names_each_program_that_does_not_fit_and_by_how_much():
  gib = 2**30
  program = {"argument_bytes": gib, "output_bytes": 0, "temp_bytes": gib, "alias_bytes": 0, "calls_per_step": 1,
             "collective_bytes_total": 0.0, "hbm_bytes_total": gib, "roofline_seconds": 1.0, "roofline_bound": "hbm"}
  report = {"topology": "v6e-8", "chips": 8, "hbm_bytes_per_chip": 32 * gib, "fits": False,
            "peak_bytes_per_chip": int(34.5 * gib), "state_bytes_per_chip": {"params": gib},
            "roofline_step_seconds": 2.0, "estimated_step_seconds": 3.0, "mfu_assumption": 0.4,
            "programs": {"ar_sampler": {**program, "peak_bytes_per_chip": 20 * gib},
                         "update": {**program, "peak_bytes_per_chip": int(34.5 * gib)},
                         "decoder": {"error": "RESOURCE_EXHAUSTED: ran out of memory", "fits": False}}}
  header = report_lib.table(report).splitlines()[0]
  assert "does not fit (update 2.5 GiB over; decoder refused by the compiler)" in header, header


def test_a_program_run_in_consecutive_parts_is_reported_as_one(monkeypatch):
  """The gathered rollout layout's reshard, in parts of 64 KiB (the released generator's go by 1 GiB): one entry
  whose bytes are the parts' sums and whose peak holds the earlier parts' outputs beside the last part's own."""
  monkeypatch.setattr(rollout_weights, "PART_BYTES", 2 ** 16)
  config = tiny_config(data__prompts_per_step=4, rollout__ar_weights="gathered")
  slice_ = topology.parse("v5e-8")
  run = abstract.build(config, mode_lib._mesh(config, topology.devices(slice_)))  # pylint: disable=protected-access
  with jax.set_mesh(run.mesh):
    program = abstract.ar_reshard(run)
  assert isinstance(program.lowered, tuple) and len(program.lowered) > 2
  entry = mode_lib.program_report(program, 0, None, slice_)
  parts = [report_lib.program_entry(program, *mode_lib.compile_with_text(lowered), 0, None, slice_.chip, slice_.chips)
           for lowered in program.lowered]
  assert entry["parts"] == len(parts)
  for key in ("argument_bytes", "output_bytes", "collective_bytes_total", "hbm_bytes_total"):
    assert entry[key] == sum(part[key] for part in parts), key
  _, states = run.component("ar")
  # The whole rollout copy comes out (TPU tiles pad small arrays' buffers).
  assert entry["output_bytes"] >= report_lib.bytes_per_chip(rollout_weights.abstract(states, run.configs.ar.dtype))
  outputs = [part["output_bytes"] for part in parts]  # nothing donated: no aliasing
  assert entry["peak_bytes_per_chip"] == max(part["peak_bytes_per_chip"] + sum(outputs[:k])
                                             for k, part in enumerate(parts))
  assert entry["peak_bytes_per_chip"] >= sum(outputs)  # the whole copy exists at the end
  assert entry["temp_bytes"] == max(part["temp_bytes"] for part in parts)


def abstract_run(chips: int):
  config = tiny_config(data__prompts_per_step=4)  # 16 samples: splits over 8 chips
  devices = topology.devices(topology.parse(f"v5e-{chips}"))
  return abstract.build(config, mode_lib._mesh(config, devices))  # pylint: disable=protected-access


def test_optimizer_state_is_sharded_like_the_parameters_and_state_bytes_scale_down():
  runs = {n: abstract_run(n) for n in (4, 8)}
  run = runs[8]
  params = {path: leaf for path, leaf in jax.tree_util.tree_flatten_with_path(run.states["ar"].trainable)[0]}
  matched = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(run.states["ar"].opt_state)[0]:
    owner = next((params[path[i:]] for i in range(len(path)) if path[i:] in params), None)
    if owner is not None and owner.shape == leaf.shape:
      assert leaf.sharding == owner.sharding, jax.tree_util.keystr(path)
      matched += 1
  assert matched == 2 * len(params)  # AdamW's two moments of every parameter
  assert any(not leaf.sharding.is_fully_replicated for leaf in params.values())
  # Bytes per chip of the sharded parameter-shaped state: the leaves whose sharded axis splits over
  # both slices hold exactly half as much on twice the chips.
  for tree in ("trainable", "opt_state"):
    halves = []
    leaves = [jax.tree.leaves(getattr(runs[n].states["ar"], tree)) for n in (4, 8)]
    for a, b in zip(*leaves):
      if not b.sharding.is_fully_replicated:
        halves.append((report_lib.bytes_per_chip(a), report_lib.bytes_per_chip(b)))
    assert halves and all(b4 == 2 * b8 for b4, b8 in halves), tree


def test_lora_run_trains_only_adapters_in_the_abstract_run():
  config = tiny_config(data__prompts_per_step=4, lora__rank=4, lora__alpha=8.0)
  run = abstract.build(config, mode_lib._mesh(config, topology.devices(topology.parse("v5e-8"))))
  assert all(isinstance(v, nnx.Variable) and type(v).__name__ == "LoraParam"
             for _, v in nnx.to_flat_state(run.states["ar"].trainable))
  assert run.states["ar"].reference is None  # the KL reference is the adapters-off model, not a copy
  assert abstract.num_params(run.states["ar"].trainable) < abstract.num_params(run.states["ar"].frozen) / 10


@pytest.mark.parametrize("name,message", [
    ("v5p-63", "count TensorCores"), ("v4-8", "expected <chip>-<size> with chip one of"), ("v6e-3", "known sizes"),
])
def test_bad_topology_names(name, message):
  with pytest.raises(UserError, match=message):
    topology.parse(name)


def test_slice_names_map_to_libtpu_topologies():
  assert topology.parse("v5p-64").topology_name == "v5p:2x4x4" and topology.parse("v5p-64").chips == 32
  assert topology.parse("v5e-256").topology_name == "v5e:16x16"
  assert topology.parse("v6e-8").topology_name == "v6e:2x4"
  assert len(topology.devices(topology.parse("v5p-8"))) == 4
  assert np.isclose(topology.parse("v5p-8").chip.hbm_bytes, 95e9)


def test_nft_programs_lower_with_their_batch_and_the_average_resident():
  """DiffusionNFT abstractly, as --mode=compile builds it: a CFG-free rollout (one DiT pass per step), an update
  over the clean latents' slots with the moving average (a resident state of its own) as the old policy."""
  from configs import demo_decoder
  config = demo_decoder.get_config("nft")
  config.data.prompts_per_step = 8  # one AR row per chip (the batch check of every run), 64 images
  run = abstract.build(config, mode_lib._mesh(config, topology.devices(topology.parse("v5e-8"))))  # pylint: disable=protected-access
  state = run.states["decoder"]
  assert jax.tree.structure(state.ema) == jax.tree.structure(state.trainable)
  assert all(a.dtype == jax.numpy.float32 and a.sharding == t.sharding
             for a, t in zip(jax.tree.leaves(state.ema), jax.tree.leaves(state.trainable)))
  assert run.resident_bytes()["ema"] > 0
  update = abstract.update(run, "decoder")
  assert any(a is state.ema for a in update.state_args)
  assert "stablehlo" in update.lowered.as_text()
  # The step model: CFG-free halves the rollout's DiT FLOPs; the update's scale with the trained slots.
  flops = lambda c: report_lib.step_flops(plan.draft(c, "tpu"), run.layout, ar_param_count=1,
                                          dit_param_count=10**6)
  guided = config.copy_and_resolve_references()
  guided.decoder.train_guidance = 1.5
  assert flops(config)["decoder"] * 2 == flops(guided)["decoder"]
  fewer, more = config.copy_and_resolve_references(), config.copy_and_resolve_references()
  fewer.decoder.train_timesteps, more.decoder.train_timesteps = 3, 6
  assert flops(more)["decoder_update"] == 2 * flops(fewer)["decoder_update"]
