"""Two processes x 4 CPU devices (gloo over loopback) train, save and resume as one run, launched as users
launch main.py (the README's demo command: the decoder in several calls), and match one process on 8 devices.

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

import os

import numpy as np

from checkpoints_convert.flax_to_hf import OrbaxLeafReader
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


def test_two_processes_train_save_and_resume_as_one_process_on_eight_devices(tmp_path):
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
