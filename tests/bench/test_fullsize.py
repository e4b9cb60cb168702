"""bench/fullsize.py, as a GPU session runs it, at the tiny size on the CPU: every stage runs and reports what it
says, so the script cannot rot between the sessions that have a GPU."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_stage_at_tiny_size(tmp_path):
  out = tmp_path / "out"
  done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fullsize.py"), "--size=tiny", "--reps=1",
                         "--train_steps=1", f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  results = json.loads((out / "fullsize.json").read_text())

  # The sampler: tokens of the released layout's shape at each batch, no roofline on a host device.
  ar = results["ar"]
  assert [r["batch"] for r in ar] == [1, 2]
  for r in ar:
    assert r["tokens_per_s"] > 0 and r["new_tokens"] > 0 and r["weight_bytes"] > 0
    assert "roofline_pct" not in r
  # The DiT against diffusers on the same weights and inputs (float32 here): the velocities agree.
  dit = results["dit"]
  assert set(dit["kernels"]) == {"xla"} and dit["kernels"]["xla"]["decode_s"] > 0 and dit["vae_s"] > 0
  ref = dit["diffusers"]
  assert ref["device"] == "cpu" and ref["step_s"] > 0
  assert ref["max_abs_diff"]["xla"] <= 1e-4 * max(1.0, ref["max_abs"]), ref
  # Both recipes trained through main.py; each stage of the step was timed.
  for recipe in ("lora", "decoupled"):
    r = results["train"][recipe]
    assert "error" not in r, r
    assert r["steps"] == 1
    for key in ("time/sampling", "time/decode", "time/reward", "time/update"):
      assert r[key] > 0, (recipe, key)
  assert results["train"]["decoupled"]["images"] == 2 * 2 * 2  # prompts x AR group x decoder samples
  assert "| lora |" in done.stdout and "| xla |" in done.stdout
