"""XLA_FLAGS of the suite's processes: LLVM at -O1 on CPUs, and a number of host devices for a subprocess.

On CPUs most of the suite's time is XLA compiling its tiny programs, and most of a compile is LLVM optimizing the
kernels it emits. At `--xla_backend_optimization_level=1` (XLA's default is 2; glmrl's own random inits already
compile at 1, `glmrl.models.glm_image`) the policy and sampling tests took 189 s instead of 215 s from an empty
cache, with the same programs and checks; a tiny program runs about as fast. main.py's users compile at XLA's
default: the flag is the suite's (tests/conftest.py), inherited by the processes it starts (`with_host_devices`
adds to the inherited flags), and only where JAX runs on the CPU alone.

The pod comparisons (tests/train/processes.py) launch main.py at XLA's default, as users launch it: their bounds
were measured there, and their step-1 bound is rounding's own size. At -O1 the demo's gradient norms at step 1, as
2 processes x 4 devices and as 1 x 8, came 3.6e-6 apart (2.05e-5 absolute), past tests/train/test_multihost.py's
1e-6 relative (+ 1e-6 absolute); at the default level, 9.2e-7.
"""

import os

SUITE_CPU_FLAGS = "--xla_backend_optimization_level=1"


def use_suite_flags_on_cpu() -> None:
  """Adds SUITE_CPU_FLAGS to XLA_FLAGS when JAX runs on the CPU alone (glmrl chose it, or JAX_PLATFORMS did) and
  XLA_FLAGS does not set an optimization level already. Before JAX starts its backend (which reads XLA_FLAGS)."""
  import jax

  import glmrl  # noqa: F401  (picks the CPU where this host has no accelerator)

  flags = os.environ.get("XLA_FLAGS", "")
  if jax.config.jax_platforms == "cpu" and "optimization_level" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {SUITE_CPU_FLAGS}".strip()


def with_host_devices(count: int, suite_flags: bool = True) -> str:
  """XLA_FLAGS as inherited, without SUITE_CPU_FLAGS unless `suite_flags`, and with `count` host devices (the last of
  several device counts is XLA's)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if not suite_flags:
    flags = flags.replace(SUITE_CPU_FLAGS, "")
  return f"{flags} --xla_force_host_platform_device_count={count}".strip()
