"""Generated tokens/s: glmrl's jitted AR sampler vs transformers `generate`, same config, same machine.

A ~50M-parameter GLM-Image AR config (released id layout and M-RoPE, smaller widths and
vocabulary), text-to-image prompts, sampling with the checkpoint defaults (temperature
0.9, top-p 0.75). Both run the full layout (preview + target grid + end token); ours
is timed after one warm-up call (compilation reported separately), transformers after
a short warm-up generate.

  python bench/ar_sampler.py [--height 256 --width 256 --batches 1,8 --prompt_len 32] [--threads 1]
                             [--dtype bfloat16]

`--threads N` gives both sides N compute threads (`bench/threads.py`: the process pinned to N CPUs, torch's
intra-op pool N); the default leaves each library its own default. The output states which. On a GPU both sides
run there (`bench/accel.py`); `--dtype` sets both sides' parameters and activations.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import glmrl  # noqa: E402,F401
from bench import accel, threads  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from transformers import GlmImageConfig, GlmImageForConditionalGeneration  # noqa: E402

from glmrl.models.ar import positions as positions_lib  # noqa: E402
from glmrl.models.ar.config import ARConfig, TextConfig, VisionConfig, VQConfig  # noqa: E402
from glmrl.models.ar.model import GlmImageAR  # noqa: E402
from glmrl.models.ar.prompt import GenerationLayout  # noqa: E402
from glmrl.sampling import ar_sampler  # noqa: E402
from glmrl.sampling.logprobs import SamplingConfig  # noqa: E402


def bench_config() -> ARConfig:
  text = TextConfig(vocab_size=32768, vision_vocab_size=16512, hidden_size=512, intermediate_size=1536,
                    num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=4096, pad_token_id=32000, eos_token_id=16385,
                    mrope_section=(8, 12, 12))
  vision = VisionConfig(depth=1, hidden_size=64, num_heads=2, image_size=64, patch_size=16, intermediate_size=128)
  vq = VQConfig(embed_dim=32, num_embeddings=16384, latent_channels=64)
  return ARConfig(text=text, vision=vision, vq=vq, image_token_id=32001)


def prompts(cfg: ARConfig, batch: int, prompt_len: int, layout: GenerationLayout, seed: int):
  """Random text ids ending with the image-start token, equal lengths (no padding)."""
  rng = np.random.default_rng(seed)
  t = cfg.text
  ids = rng.integers(t.vision_vocab_size, t.pad_token_id, (batch, prompt_len)).astype(np.int32)
  ids[:, -1] = cfg.image_start_token_id
  valid = np.ones_like(ids, bool)
  grids = np.tile(layout.grid_thw(), (batch, 1))
  per_sample = np.full(batch, len(layout.grids), np.int64)
  return ids, valid, grids, per_sample


def time_ours(model, cfg, ids, valid, grids, per_sample, layout, sampling, seed):
  pos, decode = positions_lib.rope_index(ids, valid, grids, per_sample, image_start_id=cfg.image_start_token_id,
                                         image_end_id=cfg.image_end_token_id)
  keys = jax.random.split(jax.random.key(seed), ids.shape[0])
  start = time.perf_counter()
  out = ar_sampler.sample_ids(model, ids, valid, pos, decode, keys, layout=layout, cfg=sampling)
  jax.block_until_ready(out.tokens)
  first = time.perf_counter() - start
  start = time.perf_counter()
  out = ar_sampler.sample_ids(model, ids, valid, pos, decode, jax.random.split(jax.random.key(seed + 1), len(ids)),
                            layout=layout, cfg=sampling)
  jax.block_until_ready(out.tokens)
  return time.perf_counter() - start, first


def time_reference(reference, ids, valid, grids, per_sample, n_new, sampling, device):
  t = lambda a: torch.from_numpy(a).to(device)
  inputs = dict(input_ids=t(ids.astype(np.int64)), attention_mask=t(valid.astype(np.int64)),
                image_grid_thw=t(grids), images_per_sample=t(per_sample))
  kwargs = dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, eos_token_id=None)
  generate = accel.synced(lambda n: reference.generate(**inputs, max_new_tokens=n, **kwargs), device)
  with torch.inference_mode():
    generate(8)  # warm-up
    start = time.perf_counter()
    out = generate(n_new)
    elapsed = time.perf_counter() - start
  if out.shape[1] - ids.shape[1] != n_new:
    raise RuntimeError(f"generate stopped after {out.shape[1] - ids.shape[1]} of {n_new} tokens")
  return elapsed


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--height", type=int, default=256)
  parser.add_argument("--width", type=int, default=256)
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--prompt_len", type=int, default=32)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--threads", type=int, default=0, help="compute threads on each side; 0: library defaults")
  parser.add_argument("--dtype", default="float32", choices=accel.DTYPES, help="both sides' params and compute")
  args = parser.parse_args(argv)
  threads_used = threads.limit(args.threads)
  batches = [int(b) for b in args.batches.split(",")]

  dtype = accel.jax_dtype(args.dtype)
  cfg = dataclasses.replace(bench_config(), dtype=dtype, param_dtype=dtype)
  device = accel.torch_device()
  layout = GenerationLayout.for_size(args.height, args.width, text_to_image=True)
  n_new = layout.num_new_tokens
  # The reference does not constrain to the codebook; compare like with like.
  sampling = SamplingConfig(constrain_to_codebook=False)
  torch.manual_seed(args.seed)
  reference = GlmImageForConditionalGeneration(GlmImageConfig(**cfg.to_hf())).eval()
  reference = reference.to(device=device, dtype=accel.torch_dtype(args.dtype))
  model = GlmImageAR(cfg, rngs=nnx.Rngs(args.seed))
  n_params = sum(p.numel() for p in reference.parameters())
  print(f"config: {n_params / 1e6:.1f}M parameters, {n_new} new tokens per sample "
        f"(preview {layout.grids[0]}, target {layout.target_hw}, end), prompt length {args.prompt_len}")
  print(f"devices: {accel.describe(device)}, jax x{jax.device_count()}; {args.dtype}; threads: {threads_used}")

  rows = []
  for b in batches:
    ids, valid, grids, per_sample = prompts(cfg, b, args.prompt_len, layout, args.seed)
    ours_s, first_s = time_ours(model, cfg, ids, valid, grids, per_sample, layout, sampling, args.seed)
    ref_s = time_reference(reference, ids, valid, grids, per_sample, n_new, sampling, device)
    rows.append((b, b * n_new / ours_s, b * n_new / ref_s, first_s - ours_s))

  print(f"\n{'batch':>5} | {'glmrl tok/s':>11} | {'transformers tok/s':>18} | {'ratio':>6} | {'compile s':>9}")
  print("-" * 62)
  for b, ours, ref, compile_s in rows:
    print(f"{b:>5} | {ours:>11.1f} | {ref:>18.1f} | {ours / ref:>5.2f}x | {compile_s:>9.1f}")


if __name__ == "__main__":
  main()
