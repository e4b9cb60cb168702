"""--mode=compile for NVIDIA GPUs from this CPU host (JAX's CUDA plugin, requirements-compile-gpu.txt; no GPU, no
driver): the `:tiny` decoupled recipe on one node of 8 H100s in bfloat16 as users get it from main.py, the fit
verdict against the allocator's budget, and the one-line errors of a wrong GPU name or size, a missing plugin and
a bad `XLA_PYTHON_CLIENT_MEM_FRACTION`."""

import json

import glmrl  # noqa: F401

import pytest

from glmrl.errors import UserError
from glmrl.programs import budget as budget_lib
from glmrl.programs import report as report_lib
from glmrl.programs import topology
from tests.cli import TIMEOUT_S, assert_one_line_error, main_in_process, run_main

GIB = 2**30


def test_main_writes_the_report_for_an_h100_node(tmp_path):
  # Every program of the decoupled recipe's step (the AR policy's and the DiT policy's) compiled for XLA:GPU (sm_90a)
  # on 8 abstract H100s: the plan resolved for the GPU (cuDNN attention in bfloat16), the DiT's attention on
  # cuDNN's fast path (no bias) in the rollout's decoder and in the DiT update's forward and backward, NCCL's
  # asynchronous collectives, and the verdict against 0.75 of each GPU's memory less the stated reserve.
  result = run_main("--config=configs/glm_image_t2i_decoupled.py:tiny", "--mode=compile",
                    "--config.compile.topology=h100-8", "--config.model.compute_dtype=bfloat16", tmp_path=tmp_path,
                    timeout=TIMEOUT_S)
  assert result.returncode == 0, (result.stderr + result.stdout)[-3000:]
  report = json.loads((tmp_path / "compile_report.json").read_text())
  assert (report["topology"], report["platform"], report["gpu"], report["gpu_topology"], report["chips"],
          report["nodes"]) == ("h100-8", "gpu", "NVIDIA H100 80GB HBM3", "1x1x8", 8, 1)
  assert report["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1} and report["fits"] is True
  hbm = report["hbm_bytes_per_chip"]
  assert hbm == 84942979072
  budget = report["memory_budget"]
  assert budget["allocator_fraction"] == 0.75 and budget["allocator_fraction_source"] == "default"
  assert budget["budget_bytes"] == int(0.75 * hbm) - budget_lib.POOL_RESERVE_BYTES
  assert budget["fraction_needed"] == pytest.approx((report["peak_bytes_per_chip"] + 2 * GIB) / hbm, abs=0.01)
  assert report["auto"]["model.dit_attention"] == {"value": "cudnn",
                                                   "why": "cuDNN flash attention on an NVIDIA GPU in bfloat16"}
  assert "model.dit_attention=auto -> 'cudnn'" in result.stderr
  assert set(report["programs"]) == {"ar_reshard", "ar_sampler", "decoder", "rewards", "update", "decoder_rewards",
                                     "decoder_update"}
  programs = report["programs"]
  for name, p in programs.items():
    assert 0 < p["peak_bytes_per_chip"] <= report["peak_bytes_per_chip"] <= budget["budget_bytes"], name
    assert p["roofline_seconds"] > 0, name
  fmha = {name: {c for c in p["custom_calls"] if "fmha" in c} for name, p in programs.items()}
  assert fmha["decoder"] == {"__cudnn$fmhaSoftmax"}
  assert fmha["decoder_update"] == {"__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"}
  assert not any(fmha[n] for n in ("ar_reshard", "ar_sampler", "rewards", "update", "decoder_rewards"))
  # FSDP over the 8 GPUs: the updates gather their weights and reduce their gradients with NCCL's async pairs.
  for name in ("decoder", "update", "decoder_update"):
    assert any(op.endswith("-start") for op in programs[name]["collective_ops"]), (name, programs[name])
  assert report["roofline_step_seconds"] == pytest.approx(sum(p["roofline_seconds"] for p in programs.values()))
  table = (tmp_path / "compile_report.md").read_text()
  assert table.startswith("**h100-8** (8 GPUs NVIDIA H100 80GB HBM3, 79.1 GiB HBM each): fits, peak ")
  assert "of the budget: 57.3 GiB = the allocator's pool (0.75 of HBM, JAX's default) less a 2.0 GiB reserve" in table
  assert "cuDNN attention kernels: decoder __cudnn$fmhaSoftmax; decoder_update" in table


def _gpu_report(peak: int, budget: budget_lib.Budget) -> dict:
  return {"topology": "h100-1", "platform": "gpu", "gpu": "NVIDIA H100 80GB HBM3", "nodes": 1, "chips": 1,
          "hbm_bytes_per_chip": budget.hbm_bytes, "memory_budget": budget.report(peak), "fits": peak <= budget.bytes,
          "peak_bytes_per_chip": peak, "programs": {"update": {"peak_bytes_per_chip": peak, "error": "x"}},
          "state_bytes_per_chip": {}, "roofline_step_seconds": 1.0, "estimated_step_seconds": 1.0,
          "mfu_assumption": 0.4}


def test_the_gpu_verdict_is_the_allocators_pool_less_the_reserve(monkeypatch):
  chip = topology.parse("h100-1").chip
  monkeypatch.delenv(budget_lib.FRACTION_VARIABLE, raising=False)
  default = budget_lib.of(chip)
  assert (default.fraction, default.fraction_source) == (0.75, "default")
  assert default.bytes == int(0.75 * chip.hbm_bytes) - 2 * GIB
  # 64 GiB: over the default budget (57.3 GiB); with the reserve 66 GiB = 0.834 of the GPU, so a pool of 0.84 (the
  # fraction rounded up) holds it, and the table says so.
  over = _gpu_report(64 * GIB, default)
  assert over["memory_budget"]["fits_with_raised_fraction"] is True
  assert over["memory_budget"]["fraction_needed"] == 0.84 and 0.84 * chip.hbm_bytes - 2 * GIB >= 64 * GIB
  line = report_lib.table(over).splitlines()[0]
  assert "does not fit (update 6.7 GiB over); fits with XLA_PYTHON_CLIENT_MEM_FRACTION=0.84" in line, line
  # 78 GiB leaves less than the 3 GiB outside the pool (CUDA context, NCCL): no fraction makes it fit.
  assert budget_lib.of(chip).report(78 * GIB)["fits_with_raised_fraction"] is False
  monkeypatch.setenv(budget_lib.FRACTION_VARIABLE, ".9")
  raised = budget_lib.of(chip)
  assert (raised.fraction, raised.fraction_source) == (0.9, "XLA_PYTHON_CLIENT_MEM_FRACTION=.9")
  assert "(0.90 of HBM, as set) less a 2.0 GiB reserve" in report_lib.table(_gpu_report(64 * GIB, raised))
  assert budget_lib.of(topology.parse("v5p-8").chip).bytes == topology.parse("v5p-8").chip.hbm_bytes
  for bad in ("abc", "0", "1.5", "nan"):
    monkeypatch.setenv(budget_lib.FRACTION_VARIABLE, bad)
    with pytest.raises(UserError, match=rf"XLA_PYTHON_CLIENT_MEM_FRACTION='{bad}': must be a number in \(0, 1\]"):
      budget_lib.of(chip)


@pytest.mark.parametrize("name,message", [
    ("h300-8", "config.compile.topology='h300-8': expected <chip>-<size> with chip one of ['h100', 'h200', 'v5e', "
               "'v5p', 'v6e']"),
    ("h100-12", "config.compile.topology='h100-12': no h100 target of that size; known sizes [1, 2, 4, 8, 16, 32, 64]"),
])
def test_a_wrong_gpu_target_is_one_line(tmp_path, name, message):
  result = main_in_process("--config=configs/glm_image_t2i_lora.py:tiny", "--mode=compile",
                           f"--config.compile.topology={name}", tmp_path=tmp_path)
  assert_one_line_error(result, message)


def test_gpu_names_and_node_shapes():
  assert [(s.chips, s.nodes, s.shape) for s in map(topology.parse, ("h100-1", "h200-8", "h100-16", "h200-32"))] == \
      [(1, 1, "1x1x1"), (8, 1, "1x1x8"), (16, 2, "1x2x8"), (32, 4, "1x4x8")]
  devices = topology.devices(topology.parse("h100-16"))
  assert [d.process_index for d in devices] == [0] * 8 + [1] * 8
  assert {d.device_kind for d in devices} == {"NVIDIA H100 80GB HBM3"} and devices[0].platform == "gpu"
  assert topology.DEVICE_KINDS[topology.devices(topology.parse("h200-1"))[0].device_kind] == "h200"


def test_a_host_without_the_cuda_plugin_is_told_what_to_install(tmp_path, monkeypatch):
  from jax.experimental import topologies

  def no_plugin(*args, **kwargs):  # what jax raises when no CUDA plugin is installed (xla_bridge.make_pjrt_topology)
    raise NotImplementedError("topology not implemented for cuda")

  monkeypatch.setattr(topologies, "get_topology_desc", no_plugin)
  result = main_in_process("--config=configs/glm_image_t2i_lora.py:tiny", "--mode=compile",
                           "--config.compile.topology=h100-1", tmp_path=tmp_path)
  assert_one_line_error(result, "cannot describe 1 x NVIDIA H100 80GB HBM3 (h100-1): NotImplementedError: topology "
                        "not implemented for cuda. --mode=compile for GPUs needs the CUDA plugin: pip install -r "
                        "requirements-compile-gpu.txt")


def test_a_program_xla_gpu_cannot_tile_without_a_gpu_compiles_its_gemms_on_cublas(tmp_path):
  # The tiny LoRA update in float32: XLA:GPU without a GPU to autotune on finds no Triton tiling for its rank-4
  # products; the program is compiled again with its GEMMs on cuBLAS, and the report names the option.
  result = main_in_process("--config=configs/glm_image_t2i_lora.py:tiny", "--mode=compile",
                           "--config.compile.topology=h100-1", "--config.compile.programs=update", tmp_path=tmp_path)
  assert result.returncode == 0, (result.stderr + result.stdout)[-3000:]
  report = json.loads((tmp_path / "compile_report.json").read_text())
  assert report["fits"] is True and "error" not in report["programs"]["update"]
  assert report["programs"]["update"]["compiler_options"] == {"xla_gpu_enable_triton_gemm": False}
  assert "update: XLA:GPU found no Triton GEMM tiling without a GPU; compiling its GEMMs on cuBLAS" in result.stderr
