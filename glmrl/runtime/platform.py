"""JAX's platforms, chosen when glmrl is imported (`choose`): the CPU alone on a host without an accelerator, quietly
where JAX's CUDA plugin is installed without an NVIDIA driver. `GLMRL_NO_PLATFORM_CHOICE=1` in the environment
leaves JAX's own choice (a notebook on another PJRT plugin, a library that sets JAX_PLATFORMS later itself).
"""

import importlib.util
import os
import sys

from glmrl.runtime import quiet_stderr


# JAX's CUDA plugin (requirements-compile-gpu.txt, for `--mode=compile` of GPU targets) loads its CUDA stubs when JAX
# is imported and again when JAX discovers its plugins, and on a host without an NVIDIA driver each load prints
# `Could not find cuda drivers on your machine, GPU will not be used.` after absl's `WARNING: All log messages before
# absl::InitializeLog() ...`: eight lines of noise before a run's first line (and in front of every one-line error)
# on every CPU host that can compile for GPUs. Absl prints them before any setting is read: left out of fd 2.
_CUDA_DRIVER_LINES = (r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR|"
                      r"I\d+ [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU "
                      r"will not be used\.)$")


def _cpu_alone_without_an_accelerator() -> None:
  """libtpu (requirements-compile.txt, for `--mode=compile`'s slice descriptions) makes JAX try a TPU backend at
  start-up, and on a host without TPU chips that try prints five lines of libtpu's (one of them `E0000 ...
  INVALID_ARGUMENT`) before a run's first line. Where this host has no accelerator JAX looks for (no TPU chip on
  its PCI bus, no visible NVIDIA GPU, no AMD GPU driver: JAX's own tests) and JAX_PLATFORMS does not choose,
  JAX takes the CPU it would have ended on without trying the others; describing a TPU slice loads libtpu apart."""
  if os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_FORCE_TPU_INIT") or os.path.exists("/dev/kfd"):
    return
  from jax._src import hardware_utils

  if hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0 and not hardware_utils.has_visible_nvidia_gpu():
    import jax

    jax.config.update("jax_platforms", "cpu")


def choose() -> None:
  """Imports JAX and chooses its platforms (`_cpu_alone_without_an_accelerator`); on a host without an NVIDIA driver
  where the CUDA plugin is installed, quietly (`_CUDA_DRIVER_LINES` left out), its plugins discovered inside the
  quiet part too once the platforms exclude CUDA (the plugin then skips its CUDA version checks)."""
  quiet = ("jax" not in sys.modules and not os.path.exists("/proc/driver/nvidia/version")
           and importlib.util.find_spec("jax_cuda12_plugin") is not None)
  if not quiet:
    _cpu_alone_without_an_accelerator()
    return
  with quiet_stderr.without(_CUDA_DRIVER_LINES):
    import jax
    from jax._src import xla_bridge

    _cpu_alone_without_an_accelerator()
    platforms = set((jax.config.jax_platforms or "").split(",")) - {""}
    if platforms and not platforms & {"cuda", "gpu"}:
      xla_bridge._discover_and_register_pjrt_plugins()  # pylint: disable=protected-access  # what backends() runs


OPT_OUT = "GLMRL_NO_PLATFORM_CHOICE"  # set to 1: `choose` is not called when glmrl is imported


def chosen_at_import() -> bool:
  return os.environ.get(OPT_OUT, "") not in ("1", "true", "True")
