"""JAX's platforms as glmrl chooses them when imported (glmrl/runtime/platform.py), and the way out of it."""

import os
import subprocess
import sys

import pytest
from jax._src import hardware_utils

from tests.cli import ROOT

NO_ACCELERATOR = (hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0
                  and not hardware_utils.has_visible_nvidia_gpu() and not os.path.exists("/dev/kfd"))


@pytest.mark.skipif(not NO_ACCELERATOR, reason="this host has an accelerator")
def test_a_host_without_an_accelerator_starts_jax_without_libtpus_lines():
  """libtpu is installed here (requirements-test.txt); before, the first use of JAX printed its five lines (one an
  `E0000 ... INVALID_ARGUMENT`) into every command's output. JAX_PLATFORMS, where set, still chooses."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TPU_SKIP_MDS_QUERY")}
  code = "import glmrl, jax; print(jax.default_backend(), jax.config.jax_platforms)"
  done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["cpu", "cpu"]
  assert "TPU" not in done.stderr and "E0000" not in done.stderr, done.stderr
  done = subprocess.run([sys.executable, "-c", code], env={**env, "JAX_PLATFORMS": "cpu,tpu"}, cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert "Unable to initialize backend 'tpu'" in done.stderr  # the user's choice is tried as they asked


@pytest.mark.parametrize("tpu_chips,nvidia,env,want_cpu", [
    (0, False, {}, True),
    (4, False, {}, False),
    (0, True, {}, False),
    (0, False, {"JAX_PLATFORMS": "cuda"}, False),
])
def test_the_cpu_is_chosen_only_where_no_accelerator_is_seen(tpu_chips, nvidia, env, want_cpu, monkeypatch):
  """The decision itself, on any host (the platforms JAX's own hardware tests report stubbed): a TPU chip, a visible
  NVIDIA GPU or JAX_PLATFORMS leaves JAX's choice alone."""
  import jax

  from glmrl.runtime import platform

  monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id", lambda: (tpu_chips, None))
  monkeypatch.setattr(hardware_utils, "has_visible_nvidia_gpu", lambda: nvidia)
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv("JAX_FORCE_TPU_INIT", raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  monkeypatch.setattr(os.path, "exists", lambda p, real=os.path.exists: False if p == "/dev/kfd" else real(p))
  before = jax.config.jax_platforms
  jax.config.update("jax_platforms", None)
  try:
    platform._cpu_alone_without_an_accelerator()  # pylint: disable=protected-access
    assert (jax.config.jax_platforms == "cpu") == want_cpu, jax.config.jax_platforms
  finally:
    jax.config.update("jax_platforms", before)


def test_a_library_user_can_leave_jax_its_own_choice():
  """GLMRL_NO_PLATFORM_CHOICE=1: importing glmrl sets no platform (a notebook on another PJRT plugin)."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TPU_SKIP_MDS_QUERY")}
  code = "import glmrl, jax; print(jax.config.jax_platforms)"
  chosen = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  left = subprocess.run([sys.executable, "-c", code], env={**env, "GLMRL_NO_PLATFORM_CHOICE": "1"}, cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert left.returncode == 0, left.stderr
  assert left.stdout.split() == ["None"]
  if NO_ACCELERATOR:
    assert chosen.stdout.split() == ["cpu"], chosen.stderr
