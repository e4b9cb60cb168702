"""One DiT denoising step with classifier-free guidance: ours (jitted) vs diffusers.

Both models hold the same random weights (copied through the key map) and see the same
inputs, on the same device (torch on CUDA when JAX runs on a GPU, `bench/accel.py`) and in one `--dtype`; a step is the pipeline's pair of calls (conditional with the glyph embeddings,
unconditional with the negative ones and every prior token dropped) plus the guidance
combination. With --i2i the conditional branch also reads a source-image KV cache and
the unconditional one skips it, as in image-to-image. Prints the median time of each
and the ratio, and the largest output difference, for each of our attention kernels in `--attention`. For
text-to-image it also times our step with both branches as one forward of twice the batch (`model.dit_cfg_batched`,
`glmrl.sampling.decode.guided_velocity`), side by side in the same interleaved run.

    python bench/dit_step.py --layers=4 --heads=8 --head_dim=64 --latent=32 --text_len=64 --batch=2
    python bench/dit_step.py --dtype=bfloat16 --attention=xla,cudnn   # on a GPU (bench/gpu.sh)
"""

from __future__ import annotations

import argparse
import functools
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
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="both sides' params and compute")
  p.add_argument("--attention", default="xla", help="our DiT attention kernels, comma-separated (attention.IMPLS)")
  return p.parse_args()


ARGS = parse_args()
from bench import accel, threads  # noqa: E402

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



def torch_forward(ref, latents, prior_token_ids, glyph_embeds, timestep, target_size, crop_coords, prior_token_drop,
                  kv_caches=None):
  """diffusers' forward on torch tensors already on its device (`to_torch`); a tensor there out."""
  with torch.no_grad():
    return ref(hidden_states=latents, encoder_hidden_states=glyph_embeds, prior_token_id=prior_token_ids,
               prior_token_drop=prior_token_drop, timestep=timestep, target_size=target_size,
               crop_coords=crop_coords, kv_caches=kv_caches, return_dict=False)[0]


def to_torch(inputs: dict, device, dtype) -> dict:
  """Numpy inputs as tensors on `device`, the float ones in `dtype`: copied once, outside the timed calls (ours
  are staged on the device once too)."""
  t = lambda a: torch.from_numpy(np.asarray(a)).to(device)
  return {k: t(a).to(dtype) if np.issubdtype(np.asarray(a).dtype, np.floating) else t(a) for k, a in inputs.items()}


def as_f32(x) -> np.ndarray:
  """A jax array or a torch tensor (any device) as float32 numpy."""
  if isinstance(x, torch.Tensor):
    return x.float().cpu().numpy()
  return np.asarray(jnp.asarray(x, jnp.float32))


def main():
  args = ARGS
  impls = args.attention.split(",")
  dtype, device = accel.jax_dtype(args.dtype), accel.torch_device()
  cfg = DiTConfig(num_layers=args.layers, num_attention_heads=args.heads, attention_head_dim=args.head_dim,
                  text_embed_dim=256, time_embed_dim=256, condition_dim=64, prior_vq_quantizer_codebook_size=1024,
                  dtype=dtype, param_dtype=dtype)
  ref = torch_ref.reference(cfg, seed=0)
  models = {impl: torch_ref.ported(ref, dataclasses.replace(cfg, attention_impl=impl)) for impl in impls}
  ref = ref.to(device=device, dtype=accel.torch_dtype(args.dtype))
  x = torch_ref.t2i_inputs(cfg, seed=1, batch=args.batch, height=args.latent, width=args.latent,
                           text_len=args.text_len)
  negative = np.random.default_rng(2).standard_normal(x["glyph_embeds"].shape).astype(np.float32)
  ids = x["prior_token_ids"]
  guidance = 1.5
  ref_forward = functools.partial(torch_forward, ref)
  to_ref = functools.partial(to_torch, device=device, dtype=accel.torch_dtype(args.dtype))

  ref_caches, caches = None, {}
  if args.i2i:
    src = torch_ref.t2i_inputs(cfg, seed=3, batch=1, height=args.latent, width=args.latent, text_len=0)
    src.update(timestep=np.zeros((1,), np.float32))
    ref_caches = GlmImageKVCache(num_layers=cfg.num_layers)
    ref_caches.set_mode("write")
    ref_forward(**to_ref({**src, "prior_token_drop": np.zeros(src["prior_token_ids"].shape, bool)}),
                kv_caches=ref_caches)
    ref_caches.next_sample()
    caches = {impl: m(**src, cache_mode="write")[1] for impl, m in models.items()}

  @nnx.jit
  def ours_step(model, latents, ids, glyph, negative, timestep, size, crop, cache):
    read = dict(kv_cache=cache, cache_mode="read") if cache is not None else {}
    cond = model(latents, ids, glyph, timestep, size, crop, **read)
    cond = cond[0] if cache is not None else cond
    uncond = model(latents, ids, negative, timestep, size, crop, prior_token_drop=True)
    return uncond + guidance * (cond - uncond)

  j = {k: jnp.asarray(v) for k, v in {**x, "negative": negative}.items()}
  cond_in = to_ref({**x, "prior_token_drop": np.zeros(ids.shape, bool)})
  uncond_in = to_ref({**x, "glyph_embeds": negative, "prior_token_drop": np.ones(ids.shape, bool)})

  def run_ours(impl):
    return lambda: ours_step(models[impl], j["latents"], j["prior_token_ids"], j["glyph_embeds"], j["negative"],
                             j["timestep"], j["target_size"], j["crop_coords"], caches.get(impl)).block_until_ready()

  def run_ref():
    if ref_caches is not None:
      ref_caches.set_mode("read")
    cond = ref_forward(**cond_in, kv_caches=ref_caches)
    if ref_caches is not None:
      ref_caches.set_mode("skip")
    uncond = ref_forward(**uncond_in, kv_caches=ref_caches)
    return uncond + guidance * (cond - uncond)

  run_ref = accel.synced(run_ref, device)
  want = as_f32(run_ref())
  names, runs, compile_s, diffs = ["diffusers"], [run_ref], {}, {}
  for impl in impls:
    t0 = time.perf_counter()
    run_ours(impl)()
    compile_s[impl] = time.perf_counter() - t0
    diffs[impl] = float(np.max(np.abs(as_f32(run_ours(impl)()) - want)))
    names.append(f"ours {impl}"), runs.append(run_ours(impl))
    if args.i2i:
      continue
    graphdef, state = nnx.split(models[impl])
    batch, text = j["glyph_embeds"].shape[:2]
    cond = decode.Conditioning(j["prior_token_ids"], j["glyph_embeds"], jnp.ones((batch, text), bool),
                               j["negative"], jnp.ones((batch, text), bool))

    @jax.jit
    def batched_step(state, latents, timestep, size, crop, graphdef=graphdef, cond=cond):
      m = nnx.merge(graphdef, state)
      m.cfg = dataclasses.replace(m.cfg, cfg_batched=True)
      return decode.guided_velocity(m, cond, latents, timestep, guidance, size, crop)

    def run_batched(state=state):
      return batched_step(state, j["latents"], j["timestep"], j["target_size"], j["crop_coords"]).block_until_ready()

    diffs[f"{impl}, batched"] = float(np.max(np.abs(as_f32(run_batched()) - want)))
    names.append(f"ours {impl}, both branches in one forward"), runs.append(run_batched)
  times = dict(zip(names, interleaved_medians(runs, args.reps, warmup=True)))
  n_params = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(models[impls[0]], nnx.Param)))
  print(f"config: {args.layers} layers, {args.heads}x{args.head_dim} heads, {n_params / 1e6:.1f}M params, "
        f"batch {args.batch}, latents {args.latent}x{args.latent} ({(args.latent // 2) ** 2} image tokens), "
        f"{args.text_len} glyph tokens, {'i2i (KV cache read/skip)' if args.i2i else 't2i'}, {args.dtype}")
  print(f"devices: {accel.describe(device)}; threads: {THREADS}")
  print("ours, first call incl. compile: " + ", ".join(f"{k} {v:.3f} s" for k, v in compile_s.items()))
  print(f"\n| step (median of {args.reps}, interleaved) | ms | diffusers / it | max abs diff to diffusers |")
  print("|---|---:|---:|---:|")
  ref_s = times["diffusers"]
  for name, s in times.items():
    key = name.removeprefix("ours ").replace(", both branches in one forward", ", batched")
    diff = "" if name == "diffusers" else f"{diffs[key]:.2e}"
    print(f"| {name} | {s * 1e3:.1f} | {ref_s / s:.2f}x | {diff} |")


if __name__ == "__main__":
  main()
