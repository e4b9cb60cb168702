"""Two processes x 4 CPU devices (gloo over loopback) train, save and resume as one run, launched as users
launch main.py (the README's demo command: the decoder in several calls), and match one process on 8 devices;
`--mode=eval` (a shipped benchmark, two checkpoints compared) and `--mode=generate` on the checkpoints the two
processes wrote, as 2 processes and as 1, write the same report and samples.

Tolerances: step 1 (the initial parameters) within 1e-6 relative, the JPEG size reward (a discontinuous function
of the pixels) within 1e-3 at every step. After an update the two runs' gradients differ by their collectives'
summation order (~1e-6 relative), and AdamW's first steps move each parameter by about lr * sign(gradient), so a
parameter with a near-zero gradient may move the other way: parameters agree within 2 lr per step (the optimizer's
bound) and all but 0.5% within 1e-5; later steps' continuous metrics within 1e-4 relative.

The JPEG reward weighs 1e-4. The two launches' decoders differ by rounding (the brightness reward ~1e-7 relative),
and one uint8 pixel rounding the other way changes an image's JPEG size by bytes; the advantages divide that by the
group's reward spread (~0.01). At weight 0.01 a DiT attention kernel that rounds differently (same launches, same
bounds) put step 1's mean reward 4.6e-6 and gradient norm 7.9e-6 apart, where the bound assumes values continuous in
the pixels. At 1e-4 the JPEG reward is still part of every advantage (its spread ~0.1% of theirs, by estimate: samples
scored by the wrong process would still move the gradient norm far past 1e-6), and one flip stays far under the bounds.
"""

import json
import os
import shutil

import numpy as np
import pytest

from checkpoints_convert.component_export import OrbaxLeafReader
from tests.train.processes import assert_same_metrics, launch, rows

# The README's demo command (one sample per device per decoder call: 16 images in 2 calls; the sampler reads the
# generator as `rollout.ar_weights=auto` picks on 8 host devices) with micro-batches of 4 over 8 devices (each
# partly replicated) and a checkpoint at step 2.
FLAGS = ("--config=configs/demo.py", "--config.train.micro_batch_size=4", "--config.checkpoint.save_interval=2",
         "--config.log.image_interval=2",
         # A host-side reward: each process scores its own samples. Its weight keeps the JPEG size's jumps out of
         # the compared values (see the module docstring).
         "--config.rewards=({'name': 'brightness', 'weight': 1.0}, {'name': 'jpeg_compressibility', 'weight': 1e-4})")
# Not the loss: on-policy with zero-mean advantages it is 0 up to rounding (~1e-6), whose sign is noise.
KEYS = ("reward/mean", "reward/jpeg_compressibility/mean", "grad_norm", "advantage/std", "policy/entropy")


def _params(workdir, step):
  reader = OrbaxLeafReader(str(workdir / "checkpoints" / str(step) / "params"))
  return {k: reader.read(k) for k in reader.leaves}


@pytest.mark.xdist_group("pod")
def test_two_processes_train_resume_evaluate_and_generate_as_one_process_on_eight_devices(tmp_path):
  """One test, not a shared fixture: pytest-xdist may hand a module's tests to both workers, and each would train
  the pod run again."""
  multi, single = tmp_path / "multi", tmp_path / "single"
  launch(multi, *FLAGS, "--config.train.num_steps=2")
  launch(multi, *FLAGS, "--config.train.num_steps=3")  # resumes from the checkpoint of step 2, saved by both
  launch(single, *FLAGS, "--config.train.num_steps=3", processes=1, devices=8)
  got, want = rows(multi), rows(single)
  assert [r["step"] for r in got] == [1, 2, 3]  # process 0 alone logs, no duplicates
  assert_same_metrics(got, want, KEYS, rtol_first=1e-6, rtol=1e-4)
  assert sorted(os.listdir(multi / "samples")) == sorted(os.listdir(single / "samples"))
  got_params, want_params = _params(multi, 3), _params(single, 3)
  assert got_params.keys() == want_params.keys()
  diffs = np.concatenate([np.abs(got_params[k] - want_params[k]).ravel() for k in want_params])
  assert diffs.max() <= 2 * 1e-3 * 3  # demo learning rate 1e-3, 3 updates
  assert np.mean(diffs > 1e-5) < 0.005, np.mean(diffs > 1e-5)

  # --mode=eval (PartiPrompts, the initial models and step 2 compared) and --mode=generate (step 3) on the pod's
  # checkpoints, as 2 processes and as 1 process x 8 devices on a copy of the workdir.
  one = tmp_path / "one"
  shutil.copytree(multi, one)
  # The eval command of docs/evaluation.md: the demo's 32 prompt tokens hold none of PartiPrompts' longer prompts.
  # Scored by brightness alone: the report's per-reward means and intervals would show the JPEG size's jumps.
  evaluate = (*(f for f in FLAGS if not f.startswith("--config.rewards=")), "--mode=eval", "--config.eval.benchmark=parti:2", "--config.eval.steps=0,2",
              "--config.data.max_prompt_tokens=64", "--config.rewards=({'name': 'brightness', 'weight': 1.0},)")
  launch(multi, *evaluate)
  launch(one, *evaluate, processes=1, devices=8)
  got, want = (json.loads((w / "eval" / "report.json").read_text()) for w in (multi, one))
  assert got.keys() == want.keys() and got["steps"] == want["steps"] == [0, 2]
  np.testing.assert_allclose(_numbers(got), _numbers(want), rtol=1e-5, atol=1e-6)
  assert sorted(str(p.relative_to(multi)) for p in (multi / "eval" / "images").rglob("*.png")) == \
      sorted(str(p.relative_to(one)) for p in (one / "eval" / "images").rglob("*.png"))
  launch(multi, *FLAGS, "--mode=generate")
  launch(one, *FLAGS, "--mode=generate", processes=1, devices=8)
  got, want = (np.load(w / "generate" / "tokens.npz") for w in (multi, one))
  assert int(got["step"]) == int(want["step"]) == 3
  np.testing.assert_array_equal(got["tokens"], want["tokens"])
  np.testing.assert_allclose(got["logprobs"], want["logprobs"], rtol=1e-5, atol=1e-6)
  assert sorted(p.name for p in (multi / "generate").glob("*.png")) == \
      sorted(p.name for p in (one / "generate").glob("*.png"))
  assert (multi / "generate" / "grid.png").is_file()


def _numbers(tree) -> np.ndarray:
  """Every number of a JSON tree, in its order."""
  if isinstance(tree, dict):
    return np.concatenate([_numbers(v) for v in tree.values()] or [np.zeros(0)])
  if isinstance(tree, list):
    return np.concatenate([_numbers(v) for v in tree] or [np.zeros(0)])
  if isinstance(tree, (int, float)) and not isinstance(tree, bool):
    return np.asarray([float(tree)])
  return np.zeros(0)
