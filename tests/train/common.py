"""Small configs for the train tests: the demo config with fewer, cheaper steps."""

import argparse
import json
import os
import subprocess
import sys

from configs import demo
from glmrl.runtime import gc_tuning
from tests.cli import ROOT, TIMEOUT_S


def tiny_config(**overrides):
  """configs/demo.py, with `section.key=value` overrides given as `section__key=value`."""
  c = demo.get_config()
  c.train.num_steps = 4
  c.checkpoint.save_interval = 2
  c.log.image_interval = 0
  c.grpo.group_size = 4
  return _override(c, overrides)


def _override(c, overrides: dict):
  for key, value in overrides.items():
    section, field = key.split("__")
    c[section][field] = value
  return c


def decoupled_config(**overrides):
  """Both policies on the tiny model: 2 prompts x 4 token grids x 2 decoder samples (16 images), DiT LoRA,
  the SDE window on 2 of 4 denoising steps at a random start; `section__key=value` overrides."""
  c = tiny_config()
  c.train.policies = "ar+decoder"
  c.decoder.group_size = 2
  c.decoder.train_steps = 4
  c.decoder.window_size = 2
  c.decoder.lora.rank = 4
  c.decoder.lora.alpha = 8.0
  c.decoder.beta = 0.1
  c.decoder.micro_batch_size = 8
  c.decoder.optim.learning_rate = 1e-2
  c.decoder.rewards = ({"name": "saturation", "weight": 1.0},)
  return _override(c, overrides)


def device_run_args():
  """Arguments of the subprocess runs on a forced number of host devices (--devices, --mesh=d,f,t[/d,f,t...],
  --workdir); sets XLA_FLAGS, so it must run before jax is imported. Returns (args, (data, fsdp, tensor)) of the
  first mesh; `meshes(args)` lists them all."""
  parser = argparse.ArgumentParser()
  parser.add_argument("--devices", type=int, required=True)
  parser.add_argument("--mesh", required=True)
  parser.add_argument("--workdir", required=True)
  args = parser.parse_args()
  gc_tuning.for_tracing()  # as main.py runs
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
  os.environ["JAX_PLATFORMS"] = "cpu"  # the host devices, also where a GPU is the default backend
  return args, meshes(args)[0]


def meshes(args) -> list[tuple[int, int, int]]:
  return [tuple(int(x) for x in mesh.split(",")) for mesh in args.mesh.split("/")]


def device_run(module: str, devices: int, mesh: str, workdir, timeout: int = TIMEOUT_S) -> dict:
  """Runs `python -m module --devices=N --mesh=d,f,t --workdir=DIR` (a script built on `device_run_args`) and
  returns the JSON it prints last; a failing run fails the test with its stderr. With one device, the test's own
  process has the devices the script asks for: it runs here, as `python -m` would run it (a new process would
  only add its start-up)."""
  argv = [f"--devices={devices}", f"--mesh={mesh}", f"--workdir={workdir}"]
  if devices == 1:
    return _device_run_here(module, argv)
  out = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
  assert out.returncode == 0, out.stderr[-4000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


# The meshes tests/train/multidevice_run.py trains on, by device count: on 8, 2,2,2 splits the parameters and their
# optimizer state over fsdp and tensor at once, 1,8,1 is fsdp alone; the first mesh also measures the on-policy ratio.
MULTIDEVICE_MESHES = {1: ("1,1,1",), 8: ("2,2,2", "1,8,1")}


def multidevice_runs(shared_runs, devices: int) -> dict:
  """{mesh: result} of tests/train/multidevice_run.py on `devices` devices (MULTIDEVICE_MESHES), made once per
  session. The tests that read them share the xdist group "multidevice" (one worker, one after the other: on two,
  one worker waited for the other's 8-device run instead of running other tests)."""
  def make(folder):
    out = device_run("tests.train.multidevice_run", devices, "/".join(MULTIDEVICE_MESHES[devices]), folder)
    (folder / "result.json").write_text(json.dumps(out))
    (folder / "worker").write_text(os.environ.get("PYTEST_XDIST_WORKER", ""))
  folder = shared_runs(f"multidevice_{devices}", make)
  assert (folder / "worker").read_text() == os.environ.get("PYTEST_XDIST_WORKER", ""), "not in the xdist group"
  out = json.loads((folder / "result.json").read_text())
  assert out["devices"] == devices
  return out["runs"]


def _device_run_here(module: str, argv: list[str]) -> dict:
  import runpy

  import jax

  from tests.cli import captured_output

  assert jax.device_count() == 1, jax.devices()
  saved_argv, saved_env = sys.argv, dict(os.environ)
  try:
    with captured_output() as output:
      sys.argv = [module, *argv]
      runpy.run_module(module, run_name="__main__", alter_sys=True)
  finally:
    sys.argv = saved_argv
    os.environ.clear()
    os.environ.update(saved_env)
  return json.loads(output["stdout"].strip().splitlines()[-1])
