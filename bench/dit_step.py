"""One DiT denoising step with classifier-free guidance: ours (jitted) vs diffusers.

Both models hold the same random weights (copied through the key map) and see the same
inputs; a step is the pipeline's pair of calls (conditional with the glyph embeddings,
unconditional with the negative ones and every prior token dropped) plus the guidance
combination. With --i2i the conditional branch also reads a source-image KV cache and
the unconditional one skips it, as in image-to-image. Prints the median time of each
and the ratio, and the largest output difference. For text-to-image it also times our step with both branches as
one forward of twice the batch (`model.dit_cfg_batched`, `glmrl.sampling.decode.guided_velocity`), side by side
in the same interleaved run.

    python bench/dit_step.py --layers=4 --heads=8 --head_dim=64 --latent=32 --text_len=64 --batch=2
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--latent", type=int, default=32, help="latent height = width (pixels / 8)")
  p.add_argument("--text_len", type=int, default=64)
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--i2i", action="store_true", help="condition on one source image through the KV cache")
  p.add_argument("--single_thread", action="store_true",
                 help="one intra-op thread for both torch and XLA (fairer on an oversubscribed machine)")
  return p.parse_args()


ARGS = parse_args()
from bench import threads  # noqa: E402

THREADS = threads.limit(1 if ARGS.single_thread else 0)  # before jax starts

import glmrl  # noqa: E402,F401

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache  # noqa: E402
from flax import nnx  # noqa: E402

import dataclasses  # noqa: E402

from glmrl.models.dit import DiTConfig  # noqa: E402
from glmrl.sampling import decode  # noqa: E402
from bench.timing import interleaved_medians  # noqa: E402
from tests.models.dit import torch_ref  # noqa: E402



def main():
  args = ARGS
  cfg = DiTConfig(num_layers=args.layers, num_attention_heads=args.heads, attention_head_dim=args.head_dim,
                  text_embed_dim=256, time_embed_dim=256, condition_dim=64, prior_vq_quantizer_codebook_size=1024)
  ref = torch_ref.reference(cfg, seed=0)
  model = torch_ref.ported(ref, cfg)
  x = torch_ref.t2i_inputs(cfg, seed=1, batch=args.batch, height=args.latent, width=args.latent,
                           text_len=args.text_len)
  negative = np.random.default_rng(2).standard_normal(x["glyph_embeds"].shape).astype(np.float32)
  ids = x["prior_token_ids"]
  guidance = 1.5

  ref_caches, cache = None, None
  if args.i2i:
    src = torch_ref.t2i_inputs(cfg, seed=3, batch=1, height=args.latent, width=args.latent, text_len=0)
    src.update(timestep=np.zeros((1,), np.float32))
    ref_caches = GlmImageKVCache(num_layers=cfg.num_layers)
    ref_caches.set_mode("write")
    torch_ref.ref_forward(ref, **src, prior_token_drop=np.zeros(src["prior_token_ids"].shape, bool),
                          kv_caches=ref_caches)
    ref_caches.next_sample()
    _, cache = model(**src, cache_mode="write")

  @nnx.jit
  def ours_step(model, latents, ids, glyph, negative, timestep, size, crop, cache):
    read = dict(kv_cache=cache, cache_mode="read") if cache is not None else {}
    cond = model(latents, ids, glyph, timestep, size, crop, **read)
    cond = cond[0] if cache is not None else cond
    uncond = model(latents, ids, negative, timestep, size, crop, prior_token_drop=True)
    return uncond + guidance * (cond - uncond)

  j = {k: jnp.asarray(v) for k, v in x.items()}

  def run_ours():
    return ours_step(model, j["latents"], j["prior_token_ids"], j["glyph_embeds"], jnp.asarray(negative),
                     j["timestep"], j["target_size"], j["crop_coords"], cache).block_until_ready()

  def run_ref():
    if ref_caches is not None:
      ref_caches.set_mode("read")
    cond = torch_ref.ref_forward(ref, **x, prior_token_drop=np.zeros(ids.shape, bool), kv_caches=ref_caches)
    if ref_caches is not None:
      ref_caches.set_mode("skip")
    uncond = torch_ref.ref_forward(ref, **{**x, "glyph_embeds": negative}, prior_token_drop=np.ones(ids.shape, bool),
                                   kv_caches=ref_caches)
    return uncond + guidance * (cond - uncond)

  t0 = time.perf_counter()
  run_ours()
  compile_s = time.perf_counter() - t0
  diff = float(np.max(np.abs(np.asarray(run_ours()) - run_ref())))
  runs = [run_ours, run_ref]
  if not args.i2i:
    graphdef, state = nnx.split(model)
    batch, text = j["glyph_embeds"].shape[:2]
    cond = decode.Conditioning(j["prior_token_ids"], j["glyph_embeds"], jnp.ones((batch, text), bool),
                               jnp.asarray(negative), jnp.ones((batch, text), bool))

    @jax.jit
    def batched_step(state, latents, timestep, size, crop):
      m = nnx.merge(graphdef, state)
      m.cfg = dataclasses.replace(m.cfg, cfg_batched=True)
      return decode.guided_velocity(m, cond, latents, timestep, guidance, size, crop)

    def run_batched():
      return batched_step(state, j["latents"], j["timestep"], j["target_size"], j["crop_coords"]).block_until_ready()

    batched_diff = float(np.max(np.abs(np.asarray(run_batched()) - np.asarray(run_ours()))))
    runs.append(run_batched)
  times = interleaved_medians(runs, args.reps, warmup=True)
  ours_s, ref_s = times[0], times[1]
  n_params = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
  print(f"config: {args.layers} layers, {args.heads}x{args.head_dim} heads, {n_params / 1e6:.1f}M params, "
        f"batch {args.batch}, latents {args.latent}x{args.latent} ({(args.latent // 2) ** 2} image tokens), "
        f"{args.text_len} glyph tokens, {'i2i (KV cache read/skip)' if args.i2i else 't2i'}")
  print(f"devices: jax {jax.devices()[0].platform} x{jax.device_count()}; threads: {THREADS}")
  print(f"ours (jit, first call incl. compile): {compile_s:.3f} s")
  print(f"ours (jit):  {ours_s * 1e3:.1f} ms / step (median of {args.reps}, interleaved)")
  print(f"diffusers:   {ref_s * 1e3:.1f} ms / step (median of {args.reps}, interleaved)")
  print(f"ratio diffusers / ours: {ref_s / ours_s:.2f}x")
  if not args.i2i:
    print(f"ours, both branches in one forward: {times[2] * 1e3:.1f} ms / step; diffusers / it: "
          f"{ref_s / times[2]:.2f}x; sequential / batched: {ours_s / times[2]:.2f}x; max |batched - sequential| "
          f"{batched_diff:.2e}")
  print(f"max |ours - diffusers| of the guided prediction: {diff:.2e}")


if __name__ == "__main__":
  main()
