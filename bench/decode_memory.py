"""Decoder memory with and without `sampling.decode_batch`: temporaries of the compiled denoise+decode program.

    python bench/decode_memory.py [--size=512 --batches=16,4 --attention=xla,blocked]

Compiles `glmrl.sampling.decode.denoise_and_decode` for the tiny DiT + VAE on abstract inputs (no weights)
for each batch size and prints XLA's `memory_analysis()` temporaries: a decoder call on `decode_batch`
samples needs what one row of this table says.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import glmrl  # noqa: E402,F401

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from glmrl.models import glm_image  # noqa: E402
from glmrl.sampling import decode  # noqa: E402


def temp_bytes(configs, batch: int, size: int, glyph_len: int = 16) -> int:
  dit_def, dit_state = glm_image.abstract_model("dit", configs.dit)
  vae_def, vae_state = glm_image.abstract_model("vae", configs.vae)
  sds = jax.ShapeDtypeStruct
  tokens = (size // 16) ** 2  # DiT patches of the 8x-downsampled latents, patch size 2
  d = configs.glyph.d_model
  cond = decode.Conditioning(sds((batch, tokens), jnp.int32), sds((batch, glyph_len, d), jnp.float32),
                             sds((batch, glyph_len), bool), sds((batch, glyph_len, d), jnp.float32),
                             sds((batch, glyph_len), bool))
  latents = sds((batch, configs.dit.in_channels, size // 8, size // 8), jnp.float32)
  compiled = decode.denoise_and_decode.lower(
      dit_def, dit_state, vae_def, vae_state, cond, latents, sds((2,), jnp.float32), sds((3,), jnp.float32), 1.5,
      sds((batch, 2), jnp.float32), sds((batch, 2), jnp.float32), None).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--size", type=int, default=512)
  parser.add_argument("--batches", default="16,4")
  parser.add_argument("--attention", default="xla", help="DiT attention kernels to compare, e.g. xla,blocked")
  args = parser.parse_args()
  tiny = glm_image.preset_configs("tiny")
  for impl in args.attention.split(","):
    configs = dataclasses.replace(tiny, dit=dataclasses.replace(tiny.dit, attention_impl=impl))
    for batch in (int(b) for b in args.batches.split(",")):
      print(f"{args.size}^2, {batch} samples per decoder call, {impl} attention: "
            f"{temp_bytes(configs, batch, args.size) / 2**20:.1f} MiB temporaries")


if __name__ == "__main__":
  main()
