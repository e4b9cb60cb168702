"""VAE decode: ours (jitted, Flax NNX) vs diffusers' AutoencoderKL, same small config, same machine.

Both models hold the same random weights (copied through the key map); the script checks that the
outputs agree, then times `--repeats` decodes of each after a warm-up (the first jitted call,
which compiles, is reported separately) and prints the medians and their ratio.

    python bench/vae_decode.py --batch=1 --size=256 --repeats=5 [--threads=1] [--band_rows=64,256]

`--band_rows`: ours at each band height of the decoder (`VAEConfig.band_rows`; at least the image's height: one
band per stage). `--threads`: compute threads on each side (`bench/threads.py`; 0: the libraries' defaults).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import threads  # noqa: E402

PARSER = argparse.ArgumentParser(description=__doc__.splitlines()[0])
PARSER.add_argument("--batch", type=int, default=1)
PARSER.add_argument("--size", type=int, default=256, help="output image side in pixels")
PARSER.add_argument("--repeats", type=int, default=5)
PARSER.add_argument("--threads", type=int, default=0, help="threads on each side (0: library defaults)")
PARSER.add_argument("--band_rows", default="64", help="comma-separated VAEConfig.band_rows to time")
ARGS = PARSER.parse_args()
THREADS = threads.limit(ARGS.threads)  # before jax starts

import glmrl  # noqa: E402,F401  (first: disables flax eager sharding)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import AutoencoderKL as TorchAutoencoderKL  # noqa: E402
from flax import nnx  # noqa: E402

from checkpoints_convert.maps.vae import RULES  # noqa: E402
from checkpoints_convert.rules import KeyMap, flax_path_str  # noqa: E402
from glmrl.models.vae import AutoencoderKL, VAEConfig  # noqa: E402


def bench_config() -> VAEConfig:
  """The released layout (4 levels, 16 latent channels, 8x) at a quarter of the widths, with the
  mid-block attention on so that path is timed too."""
  return VAEConfig.full(block_out_channels=(32, 128, 256, 256), layers_per_block=3,
                        mid_block_add_attention=True)


def load(cfg: VAEConfig, state_dict) -> AutoencoderKL:
  model = nnx.eval_shape(lambda: AutoencoderKL(cfg, rngs=nnx.Rngs(0)))
  state = nnx.state(model, nnx.Param)
  params = {flax_path_str(p): v for p, v in nnx.to_flat_state(state)}
  keymap = KeyMap(RULES)
  for key, tensor in state_dict.items():
    path, transform = keymap.hf_to_flax(key)
    params[path].set_value(jnp.asarray(transform.to_flax(tensor.numpy())))
  nnx.update(model, state)
  return model


def timed(fn, repeats: int) -> list[float]:
  out = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t)
  return out


def main():
  args = ARGS
  cfg = bench_config()
  if args.size % cfg.scale_factor:
    raise ValueError(f"--size={args.size} must be a multiple of {cfg.scale_factor}")

  torch.manual_seed(0)
  ref = TorchAutoencoderKL(**{k: v for k, v in cfg.to_hf().items() if not k.startswith("_")}).eval()
  side = args.size // cfg.scale_factor
  z = np.random.default_rng(0).standard_normal((args.batch, cfg.latent_channels, side, side)).astype(np.float32)
  z_torch, z_jax = torch.from_numpy(z), jnp.asarray(z.transpose(0, 2, 3, 1))

  def run_torch():
    with torch.no_grad():
      return ref.decode(z_torch, return_dict=False)[0]

  want = run_torch()
  torch_s = timed(run_torch, args.repeats)
  n_params = sum(p.numel() for p in ref.parameters())
  print(f"device: {jax.devices()[0].platform} ({os.cpu_count()} cpus); threads: {THREADS}")
  print(f"config: block_out_channels={cfg.block_out_channels} layers_per_block={cfg.layers_per_block} "
        f"mid attention={cfg.mid_block_add_attention} ({n_params / 1e6:.1f}M params)")
  print(f"decode [{args.batch}, {side}, {side}, {cfg.latent_channels}] -> {args.size}x{args.size} px, "
        f"{args.repeats} repeats")
  print(f"diffusers:   median {statistics.median(torch_s) * 1e3:.1f} ms")
  for band_rows in (int(b) for b in args.band_rows.split(",")):
    ours = load(dataclasses.replace(cfg, band_rows=band_rows), ref.state_dict())
    decode = nnx.jit(lambda m, z: m.decode(z))
    t = time.perf_counter()
    out = jax.block_until_ready(decode(ours, z_jax))
    compile_s = time.perf_counter() - t
    diff = float(np.abs(np.asarray(out).transpose(0, 3, 1, 2) - want.numpy()).max())
    ours_s = timed(lambda: jax.block_until_ready(decode(ours, z_jax)), args.repeats)
    print(f"ours, band_rows={band_rows}: first call {compile_s:.2f} s (compile), median "
          f"{statistics.median(ours_s) * 1e3:.1f} ms, diffusers / ours "
          f"{statistics.median(torch_s) / statistics.median(ours_s):.2f}x, max |ours - diffusers| = {diff:.2e}")


if __name__ == "__main__":
  main()
