"""Both sides of a benchmark on the same device and in the same dtype.

torch computes on CUDA when JAX's default backend is a GPU, else on the CPU; a GPU run whose torch has no CUDA is
an error, not a GPU-against-CPU ratio. `--dtype` names one dtype for both sides' parameters and activations.
"""

from __future__ import annotations

DTYPES = ("float32", "bfloat16")


def torch_device() -> str:
  """"cuda" when JAX computes on a GPU, else "cpu"."""
  import jax
  import torch

  if jax.default_backend() != "gpu":
    return "cpu"
  if not torch.cuda.is_available():
    raise SystemExit(f"JAX runs on {jax.devices()[0]} but torch {torch.__version__} sees no CUDA device: the "
                     "two sides would not compute on the same device")
  return "cuda"


def torch_dtype(name: str):
  import torch

  return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def jax_dtype(name: str):
  import jax.numpy as jnp

  return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def synced(fn, device: str):
  """`fn` that returns once torch's queued work is done (a CUDA call returns when its kernels are queued)."""
  if device != "cuda":
    return fn
  import torch

  def run(*args, **kwargs):
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    return out

  return run


def describe(device: str) -> str:
  """The two sides' devices, for the bench's output."""
  import jax
  import torch

  name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
  return f"jax {jax.devices()[0].device_kind} ({jax.default_backend()}), torch {name}"
