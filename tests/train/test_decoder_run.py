"""Decoder RL as users run it: the decoder demo through main.py, and both policies in one run on 8 host
devices with a resume in the middle."""

import json
import os

import numpy as np

from tests.cli import completed
from tests.train.common import device_run


def test_decoder_demo_learns_through_main(tmp_path):
  workdir = tmp_path / "demo"
  out = completed("--config=configs/demo_decoder.py", tmp_path=workdir)  # main.py's __main__, in this process
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["step"] for r in rows] == list(range(1, 31))
  # On-policy: the first update's ratio is exactly 1 at every trained step of every rollout.
  assert all(r["decoder/first_iter/ratio/min"] == r["decoder/first_iter/ratio/max"] == 1.0 for r in rows)
  assert max(r["decoder/logprob/sampler_vs_recomputed_max_abs"] for r in rows) < 1e-4
  curve = [r["decoder/reward/mean"] for r in rows]
  first, last = np.mean(curve[:5]), np.mean(curve[-5:])
  # The within-group reward spread is ~0.003 at the start; require a rise of several times that.
  assert last - first > 0.015, curve
  assert "reward/mean" not in rows[0] and "loss" not in rows[0]  # the AR policy does not train
  items = set(os.listdir(workdir / "checkpoints" / "30"))
  # The DiT's adapters and optimizer state; no AR item (the generator is as built, nothing to save).
  assert {"decoder_params", "decoder_opt_state", "rng", "meta"} <= items and not {"params", "opt_state"} & items
  assert "30 steps" in out.stderr and "reward" in out.stderr
  # Generation samples with the trained DiT adapters of the last step (the ODE, sampling.dit_steps).
  out = completed("--config=configs/demo_decoder.py", "--mode=generate", tmp_path=workdir)
  assert "the trained parameters of step 30" in out.stderr
  assert (workdir / "generate" / "grid.png").is_file()


def test_both_policies_on_eight_devices_resume_exactly(tmp_path):
  result = device_run("tests.train.decoupled_run", 8, "2,2,2", tmp_path)
  assert result["devices"] == 8
  assert any("fsdp" in s or "tensor" in s for s in result["dit_shardings"]), result["dit_shardings"]
  for step in result["straight"]:
    for policy in ("ar/", "decoder/"):
      assert step[f"{policy}first_iter/ratio/min"] == step[f"{policy}first_iter/ratio/max"] == 1.0
      assert step[f"{policy}skipped"] == 0.0
    assert step["decoder/kl"] >= 0.0
  assert result["straight"][1]["decoder/kl"] > 0.0  # the adapters moved away from the base after one update
  # A resumed run draws and computes what the uninterrupted one did, bit for bit.
  assert result["resumed_second"] == result["straight"][1]
  assert result["resumed_sums"] == result["sums"]
