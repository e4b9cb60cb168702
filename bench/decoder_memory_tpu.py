"""Where the decoder program's TPU temporaries are: the whole program, the DiT denoising loop alone, the VAE
decode alone, per DiT attention kernel, compiled from this CPU for a TPU slice (libtpu).

    python -m bench.decoder_memory_tpu [--config configs/glm_image_t2i.py --topology v5p-64 --attention xla,splash]

Builds the run abstractly as `--mode=compile` does (`glmrl.programs.abstract.build`, the config's mesh and decode
chunk) and compiles, for each kernel:
1. the run's decoder program (`programs.decoder`: denoise loop + VAE decode + uint8 images);
2. the same with the VAE decode replaced by a nearest-neighbour upsample of three latent channels (the DiT's
   loop and the rest of the program, without the VAE);
and once, the VAE decode alone on the chunk's latents with the same shardings, as the program runs it (each
device's own samples, `sharding.per_device_samples`) and as one GSPMD program (how it ran before). Prints XLA's
`memory_analysis()` temporaries per chip of each.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import glmrl  # noqa: E402,F401

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from glmrl import sharding as sharding_lib  # noqa: E402
from glmrl.programs import abstract as abstract_lib  # noqa: E402
from glmrl.programs import topology as topology_lib  # noqa: E402
from glmrl.models.vae import model as vae_model  # noqa: E402
from glmrl.sampling import decode as decode_lib  # noqa: E402
from glmrl.sampling import pipeline  # noqa: E402

GIB = 2 ** 30


def temporaries(lowered) -> float:
  return lowered.compile().memory_analysis().temp_size_in_bytes / GIB


def decoder(run) -> float:
  jax.clear_caches()  # jit's trace cache would hand the other variant's lowering back
  with jax.set_mesh(run.mesh):
    return temporaries(abstract_lib.decoder(run).lowered)


def build(args, attention: str):
  config = importlib.import_module(args.config.removesuffix(".py").replace("/", ".")).get_config(None)
  config.model.dit_attention = attention
  config.compile.topology = args.topology
  devices = topology_lib.devices(topology_lib.parse(args.topology))
  mesh = sharding_lib.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices=devices)
  return abstract_lib.build(config, mesh)


def decoder_without_vae(run) -> float:
  original = vae_model.AutoencoderKL.decode_normalized
  vae_model.AutoencoderKL.decode_normalized = lambda self, z: jnp.repeat(jnp.repeat(z[..., :3], 8, 1), 8, 2)
  try:
    return decoder(run)
  finally:
    vae_model.AutoencoderKL.decode_normalized = original


def vae_alone(run, per_device: bool) -> float:
  vae_def, vae_state = run.models["vae"]
  cfg = run.config
  chunk = pipeline.decode_chunk(cfg.sampling.decode_batch, run.images, run.request.images_per_prompt,
                                sharding_lib.batch_devices(run.mesh))
  c, h, w = run.latent_shape
  latents = abstract_lib.batch_array(run.mesh, (chunk, c, h, w), jnp.float32)
  one_program = functools.partial(decode_lib.decode_images, vae_def)

  @jax.jit
  def decode(state, z_BxCxhxw):
    if per_device:  # as the decoder program runs it
      return sharding_lib.per_device_samples(one_program, state, z_BxCxhxw)
    return one_program(state, z_BxCxhxw)

  with jax.set_mesh(run.mesh):
    return temporaries(decode.lower(vae_state, latents))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/glm_image_t2i.py")
  parser.add_argument("--topology", default="v5p-64")
  parser.add_argument("--attention", default="xla,splash")
  args = parser.parse_args()
  rows = []
  for attention in args.attention.split(","):
    run = build(args, attention)
    for name, fn in (("decoder program", decoder), ("decoder program without the VAE decode", decoder_without_vae)):
      start = time.perf_counter()
      rows.append((name, attention, fn(run), time.perf_counter() - start))
  for name, per_device in (("VAE decode alone, each device's samples (the program's)", True),
                           ("VAE decode alone, one GSPMD program", False)):
    start = time.perf_counter()
    rows.append((name, "-", vae_alone(run, per_device), time.perf_counter() - start))
  print(f"{args.config} on {args.topology}, temporaries per chip (XLA's memory_analysis, libtpu compile)")
  print("| program | DiT attention | temporaries GiB | compile s |\n| --- | --- | ---: | ---: |")
  for name, attention, gib, seconds in rows:
    print(f"| {name} | {attention} | {gib:.2f} | {seconds:.0f} |")


if __name__ == "__main__":
  main()
