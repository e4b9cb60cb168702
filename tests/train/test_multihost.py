"""Two processes x 4 CPU devices (gloo over loopback) train, save and resume as one run, launched as users
launch main.py (the sampler reading the generator in the gathered rollout layout), and match one process on 8
devices (the update's layout).

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
import socket
import subprocess
import sys

import numpy as np

from checkpoints_convert.flax_to_hf import OrbaxLeafReader
from tests.test_main import ROOT

FLAGS = ("--config=configs/demo.py", "--config.mesh.fsdp=8", "--config.grpo.group_size=4",
         "--config.train.micro_batch_size=4", "--config.checkpoint.save_interval=2", "--config.log.image_interval=2",
         # A host-side reward: each process scores its own samples. Its weight keeps the JPEG size's jumps out of
         # the compared values (see the module docstring).
         "--config.rewards=({'name': 'brightness', 'weight': 1.0}, {'name': 'jpeg_compressibility', 'weight': 1e-4})")
# Not the loss: on-policy with zero-mean advantages it is 0 up to rounding (~1e-6), whose sign is noise.
KEYS = ("reward/mean", "reward/jpeg_compressibility/mean", "grad_norm", "advantage/std", "policy/entropy")


def _env(devices: int) -> dict:
  return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _main(workdir, steps, *extra):
  return [sys.executable, os.path.join(ROOT, "main.py"), f"--workdir={workdir}", *FLAGS,
          f"--config.train.num_steps={steps}", *extra]


def _two_processes(workdir, steps):
  port = _free_port()
  # As on a pod: the sampler reads the generator gathered once per rollout (config.rollout.ar_weights), the
  # single process the update's layout; both draw the same tokens.
  procs = [subprocess.Popen(_main(workdir, steps, f"--coordinator_address=localhost:{port}", "--num_processes=2",
                                  f"--process_id={i}", "--config.rollout.ar_weights=gathered"), env=_env(4),
                            cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]


def _rows(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _params(workdir, step):
  reader = OrbaxLeafReader(str(workdir / "checkpoints" / str(step) / "params"))
  return {k: reader.read(k) for k in reader.leaves}


def test_two_processes_train_save_and_resume_as_one_process_on_eight_devices(tmp_path):
  multi, single = tmp_path / "multi", tmp_path / "single"
  _two_processes(multi, 2)
  _two_processes(multi, 3)  # resumes from the checkpoint of step 2, saved by both processes
  one = subprocess.run(_main(single, 3), env=_env(8), cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert one.returncode == 0, one.stderr[-3000:]
  got, want = _rows(multi), _rows(single)
  assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]  # process 0 alone logs, no duplicates
  for a, b in zip(got, want):
    for k in KEYS:
      rtol = 1e-3 if "jpeg" in k else (1e-6 if a["step"] == 1 else 1e-4)
      np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=1e-6, err_msg=f"step {a['step']} {k}")
    assert a["first_iter/ratio/min"] == a["first_iter/ratio/max"] == 1.0
  assert sorted(os.listdir(multi / "samples")) == sorted(os.listdir(single / "samples"))
  got_params, want_params = _params(multi, 3), _params(single, 3)
  assert got_params.keys() == want_params.keys()
  diffs = np.concatenate([np.abs(got_params[k] - want_params[k]).ravel() for k in want_params])
  assert diffs.max() <= 2 * 1e-3 * 3  # demo learning rate 1e-3, 3 updates
  assert np.mean(diffs > 1e-5) < 0.005, np.mean(diffs > 1e-5)
