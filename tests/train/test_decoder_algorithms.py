"""DiffusionNFT and AWM as users run them: the decoder demo's `:nft` and `:awm` through main.py train, save the
moving average with every checkpoint, and a run that lost its last checkpoint (a preemption) resumes from the
one before and redoes the same steps bit for bit, the moving average included; `--use_ema` generates with it.
main.py's `__main__` runs in the test's process (tests/cli.py); tests/train/test_decoder_run.py launches the decoder
demo as a process."""

import json
import shutil

import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.cli import completed

VOLATILE = ("time/", "throughput/")


def rows(workdir):
  return {r["step"]: {k: v for k, v in r.items() if not k.startswith(VOLATILE)}
          for r in map(json.loads, open(workdir / "metrics.jsonl"))}


def leaves(path):
  return ocp.PyTreeCheckpointer().restore(str(path))


@pytest.mark.parametrize("algorithm", ["nft", "awm"])
def test_demo_trains_saves_its_average_and_resumes_bit_identically(tmp_path, algorithm):
  straight = tmp_path / "straight"
  flags = (f"--config=configs/demo_decoder.py:{algorithm}", "--config.train.num_steps=4",
           "--config.checkpoint.save_interval=2", "--config.checkpoint.max_to_keep=5")
  if algorithm == "awm":  # AWM's released clip range (its config/dgx_awm.py): the ratio unbounded below
    flags += ("--config.decoder.clip_range=1",)
  completed(*flags, tmp_path=straight)
  want = rows(straight)
  assert sorted(want) == [1, 2, 3, 4]
  for r in want.values():
    assert r["decoder/skipped"] == 0.0 and np.isfinite(r["decoder/loss"])
    if algorithm == "awm":  # on-policy: the first update's ratio is exactly 1
      assert r["decoder/first_iter/ratio/min"] == r["decoder/first_iter/ratio/max"] == 1.0
    else:  # no likelihood, no ratio
      assert "decoder/ratio/min" not in r and "decoder/old_deviation" in r
  ckpt = straight / "checkpoints"
  assert {"decoder_params", "decoder_opt_state", "decoder_ema"} <= {p.name for p in (ckpt / "4").iterdir()}
  ema_4, params_4 = leaves(ckpt / "4" / "decoder_ema"), leaves(ckpt / "4" / "decoder_params")
  # The average is of the adapters (float32) and differs from them once they have moved.
  flat = lambda t: [np.asarray(x) for x in __import__("jax").tree.leaves(t)]
  assert all(e.dtype == np.float32 for e in flat(ema_4))
  assert any(np.any(e != p) for e, p in zip(flat(ema_4), flat(params_4)))

  # A preemption lost step 4's checkpoint: the rerun resumes at step 2 and redoes steps 3 and 4.
  resumed = tmp_path / "resumed"
  shutil.copytree(straight, resumed)
  shutil.rmtree(resumed / "checkpoints" / "4")
  completed(*flags, tmp_path=resumed)
  got = rows(resumed)
  for step in (3, 4):
    assert got[step] == want[step], step
  for a, b in zip(flat(leaves(resumed / "checkpoints" / "4" / "decoder_ema")), flat(ema_4)):
    np.testing.assert_array_equal(a, b)
  if algorithm == "nft":  # generation samples with the average of the last step's adapters
    out = completed(*flags, "--mode=generate", "--use_ema", tmp_path=resumed)
    assert "the trained parameters (their moving average) of step 4" in out.stderr
    assert (resumed / "generate" / "grid.png").is_file()


def test_flow_grpo_with_grpo_guard_and_a_sliding_window(tmp_path):
  """GRPO-Guard's ratio and MixGRPO's sliding window through main.py: the window walks its range one step per
  rollout, the first update's ratio is exactly 1, and the second update reads the first one's step means."""
  workdir = tmp_path / "guard"
  completed("--config=configs/demo_decoder.py", "--config.train.num_steps=3", "--config.decoder.ratio_norm=True",
            "--config.decoder.window_slide_every=1", "--config.decoder.window_slide_stride=1",
            "--config.decoder.num_iterations=2", tmp_path=workdir)
  got = rows(workdir)
  # The demo's window_range (0, 3) of 4 steps: starts 0 and 1 (a window of 2 never holds the final step).
  assert [got[s]["decoder/window_start"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
  for r in got.values():
    assert r["decoder/first_iter/ratio/min"] == r["decoder/first_iter/ratio/max"] == 1.0
    assert r["decoder/skipped"] == 0.0 and np.isfinite(r["decoder/loss"])
    # After one update the adapters moved: the later ratio departs from 1 and stays finite.
    assert np.isfinite(r["decoder/iter1/ratio/max"]) and r["decoder/iter1/ratio/max"] != 1.0


def test_cps_with_the_reference_logprob_trains_through_main(tmp_path):
  """`:cps` with Flow-GRPO's own CPS log-prob (`--config.decoder.logprob=flow_grpo`): the sampler and the learner
  take the same log-prob (float32: equal up to rounding), the first update's ratio is exactly 1, the second's
  moves."""
  workdir = tmp_path / "cps"
  completed("--config=configs/demo_decoder.py:cps", "--config.train.num_steps=2", "--config.decoder.logprob=flow_grpo",
            "--config.decoder.num_iterations=2", tmp_path=workdir)
  for r in rows(workdir).values():
    assert r["decoder/first_iter/ratio/min"] == r["decoder/first_iter/ratio/max"] == 1.0
    assert r["decoder/logprob/sampler_vs_recomputed_max_abs"] < 1e-5
    assert r["decoder/skipped"] == 0.0 and np.isfinite(r["decoder/iter1/ratio/max"])
    assert r["decoder/iter1/ratio/max"] != 1.0


def test_dgpo_demo_trains_through_main(tmp_path):
  """`:dgpo` as released (rollouts at CFG 4.5, a CFG-free loss, clip_dsm against the moving average), but for a clip
  range of 1e-5 and an average that keeps 0.3 of itself from the first update on (DGPO's own decays 0 at its first
  update, so at its second the average is the adapters): at the first update the adapters are the base (LoRA B =
  0), so every group's DPO weight is sigmoid(0) = 0.5 to float32 rounding, and the average is the adapters (its ratios equal 1 to float32 rounding: at a range of 1e-9 some clipped, at 1e-5
  none does); at the second the average lags the
  adapters, and some images must clip. The average clip_dsm reads is saved beside the adapters and their
  optimizer."""
  workdir = tmp_path / "dgpo"
  completed("--config=configs/demo_decoder.py:dgpo", "--config.train.num_steps=2", "--config.checkpoint.save_interval=2",
            "--config.decoder.clip_range=1e-5", "--config.decoder.ema.ramp=0", tmp_path=workdir)
  got = rows(workdir)
  # The first update's weights: sigmoid(S) with S = beta_dpo sum_i A_i delta_i / G, where delta_i is the policy's
  # flow error minus the reference's, the same function of the same inputs in two compiled programs (the gradient's
  # forward, fused with its backward, and the reference's): they differ by the rounding of a float32 mean over the
  # latent's D <= 4096 elements, at most log2(D) = 12 roundings of 2**-24 of the error (<= 4: unit-variance noise and
  # latents). |sigmoid(S) - 0.5| <= |S| / 4 and |A_i| <= (G - 1) / sqrt(G) (standardised in a group of G = 8):
  # 1.8e-4. Seen: 6.0e-8 (1 ulp of 0.5) on one AMD EPYC host, 1.5e-7 on another; the second update's 0.068.
  group = 8
  bound = 100.0 * (group - 1) / np.sqrt(group) * 4.0 * 12 * 2.0**-24 / 4
  assert abs(got[1]["decoder/dgpo/group_weight"] - 0.5) <= bound
  assert abs(got[2]["decoder/dgpo/group_weight"] - 0.5) > 10 * bound
  assert got[1]["decoder/dgpo/clip_frac"] == 0.0 and got[2]["decoder/dgpo/clip_frac"] > 0.0
  assert all(r["decoder/skipped"] == 0.0 and np.isfinite(r["decoder/loss"]) for r in got.values())
  assert {p.name for p in (workdir / "checkpoints" / "2").iterdir()} >= {"decoder_params", "decoder_opt_state",
                                                                         "decoder_ema"}
