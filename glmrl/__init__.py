"""glmrl: GRPO post-training of GLM-Image in JAX/Flax NNX.

Tensor names carry their shapes after the last underscore, one letter per axis joined by `x`
(`q_BxLxHxD`); letters written together name one flattened axis (`flat_YLxD`: Y x L rows), digits
are literal sizes, and `...`-style leading axes take the names of the common case. Each letter has
one meaning throughout the package:

  B  rows of a batch (samples; prompts x group size in a rollout)
  P  prompts (groups of a rollout)            G  samples per prompt (the group size)
  N  generated (new) tokens of a sample       S  a whole sequence (prompt + generated, or a joint
  L  tokens of this call's input (queries)       text + image sequence)
  T  key/value tokens attended to (cache slots, text tokens)
  X  image tokens or patches                  Y  glyph texts (quoted strings) of a batch
  E  model width                              D  per-head or per-token feature width
  H  attention heads                          K  key/value heads        Q  query heads per key/value head
  I  input width of a linear map              O  output width           J  members of a stacked kernel
  U  chunks of a chunked loop                 Z  tokens of one chunk    M  micro-batches
  R  LoRA rank                                W  trained steps of a DiT policy (its SDE window's, or
                                                 the slots drawn per image)
  V  vocabulary or codebook entries           C  channels               F  features (frequencies, patch pixels)
  A  rotary (angle) features                  h, w  spatial height and width (pixels, latents or grids)
  s  denoising steps of a schedule            e  its step edges (s + 1 sigmas)
"""

import importlib.util
import os
import sys

from glmrl import quiet_stderr


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


def _start_jax() -> None:
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


_start_jax()

import flax  # noqa: E402

# Parameters carry logical axis names (`out_sharding=("embed", "mlp")`) that are
# resolved against a mesh by `glmrl.sharding` when the train state is built.
# Eager sharding would demand a mesh at every module construction (tests,
# conversion, eval_shape), so it is turned off library-wide.
flax.config.update("flax_always_shard_variable", False)
