"""bench/fullsize.py, as a GPU session runs it, at the tiny size on the CPU: every stage runs and reports what it
says, so the script cannot rot between the sessions that have a GPU.

Each reported figure is checked against what it is made of, computed here independently where it can be: the
tokens and bytes of a sampler step from the recipe's config and abstract model, rates from the seconds they divide,
the batch of a training step from the flags, the stages of a step inside the step. A figure left at zero, or
computed from the wrong quantity, breaks one of these relations (a bare `> 0` would let the latter through).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.cli import ROOT, TIMEOUT_S

BATCHES = (1, 2)  # --size=tiny's AR batches
PROMPTS, GROUP, DECODER_GROUP = 2, 2, 2  # --size=tiny's train batch; the tiny decoupled recipe's decoder samples


def _ar_expectations():
  """(new tokens per sample, weight bytes a decoding step reads, KV-cache bytes per token) of the tiny LoRA
  recipe's generator, from its config and abstract model."""
  from bench import fullsize_recipe
  from glmrl.programs import plan
  from glmrl.models import glm_image
  from glmrl.models.ar.prompt import GenerationLayout

  config = fullsize_recipe.get_config("lora,tiny")
  cfg = plan.model_configs(config).ar
  layout = GenerationLayout.for_size(config.data.height, config.data.width, text_to_image=True)
  _, abstract = glm_image.abstract_model("ar", cfg)
  flat = jax.tree_util.tree_leaves_with_path(abstract)
  read = lambda path: ("'text'" in path and "'embed'" not in path) or "'lm_head'" in path
  weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for p, v in flat if read(jax.tree_util.keystr(p)))
  kv = 2 * cfg.text.num_hidden_layers * cfg.text.num_key_value_heads * cfg.text.head_dim * np.dtype(cfg.dtype).itemsize
  return layout.num_new_tokens, weights, kv


def test_every_stage_at_tiny_size(tmp_path):
  out = tmp_path / "out"
  done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fullsize.py"), "--size=tiny", "--reps=1",
                         "--train_steps=1", f"--out={out}"], cwd=ROOT, capture_output=True, text=True,
                        timeout=TIMEOUT_S)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  results = json.loads((out / "fullsize.json").read_text())

  # The sampler: the released layout's tokens at each batch; its rates and bytes from their parts; no roofline on a
  # host device.
  new_tokens, weights, kv_per_token = _ar_expectations()
  ar = results["ar"]
  assert [r["batch"] for r in ar] == list(BATCHES)
  for r in ar:
    assert r["new_tokens"] == new_tokens and r["weight_bytes"] == weights > 0
    assert r["seconds"] > 0 and r["compile_s"] >= -r["seconds"]
    assert r["tokens_per_s"] == pytest.approx(r["batch"] * new_tokens / r["seconds"], rel=1e-9)
    assert r["ms_per_step"] == pytest.approx(1e3 * r["seconds"] / new_tokens, rel=1e-9)
    assert r["bytes_per_step"] == pytest.approx(
        weights + r["batch"] * kv_per_token * (r["prompt_tokens"] + new_tokens / 2), rel=1e-12)
    assert r["speedup_vs_first"] == pytest.approx(r["tokens_per_s"] / ar[0]["tokens_per_s"], rel=1e-9)
    assert "roofline_pct" not in r
  # The DiT against diffusers on the same weights and inputs (float32 here): the velocities agree.
  dit = results["dit"]
  assert set(dit["kernels"]) == {"xla"} and dit["steps"] == 4 and dit["vae_s"] > 0
  xla = dit["kernels"]["xla"]
  assert xla["step_s"] > 0 and xla["decode_s"] > 0 and xla["step_flops"] > 0
  ref = dit["diffusers"]
  assert ref["device"] == "cpu" and ref["step_s"] > 0
  assert ref["max_abs"] > 0 and ref["max_abs_diff"]["xla"] <= 1e-4 * max(1.0, ref["max_abs"]), ref
  # Both recipes trained through main.py; each stage of the step was timed, within the step.
  for recipe, images in (("lora", PROMPTS * GROUP), ("decoupled", PROMPTS * GROUP * DECODER_GROUP)):
    r = results["train"][recipe]
    assert "error" not in r, r
    assert r["steps"] == 1 and r["images"] == images
    stages = [r[key] for key in ("time/sampling", "time/decode", "time/reward", "time/update")]
    assert all(s > 0 for s in stages), (recipe, stages)
    assert sum(stages) <= r["time/step"] * (1 + 1e-6) and r["first_step_s"] == r["time/step"], r
    assert r["wall_s"] > r["time/step"]
  assert "| lora |" in done.stdout and "| xla |" in done.stdout


def test_the_compile_stage_reports_each_recipes_peak_for_a_gpu(tmp_path):
  # What bench/gpu.sh runs after the measured steps: the train stage's recipe compiled for the lent GPU's kind on the
  # host's CPU, in bfloat16 as the released recipes compute on a GPU; its peak and budget are the compile report's
  # (the measured peak's ratio needs the train stage).
  out = tmp_path / "out"
  done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fullsize.py"), "--size=tiny", "--stages=compile",
                         "--recipes=lora", "--compile_topology=h100-1", "--train_flags=--config.model.compute_dtype=bfloat16",
                         f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  row = json.loads((out / "fullsize.json").read_text())["compile"]["lora"]
  report = json.loads((out / "compile_lora" / "compile_report.json").read_text())
  assert row["topology"] == "h100-1" and row["fits"] is report["fits"] is True
  assert row["compiled_peak_gib"] == report["peak_bytes_per_chip"] / 2**30 > 0
  assert row["budget_gib"] == pytest.approx((int(0.75 * 84942979072) - 2 * 2**30) / 2**30)
  assert "measured_over_compiled" not in row and "| lora | h100-1 |" in done.stdout
