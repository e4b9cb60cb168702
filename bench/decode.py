"""AR tokens -> pixels: ours (jitted, compile excluded) vs diffusers' GlmImagePipeline, same config and machine.

Two timings each, in one run: one denoising step (the conditional and the unconditional DiT
branch, the guidance combination and the Euler update) and the whole decode (every denoising
step, then the VAE decode) with the AR tokens, glyph embeddings and initial latents given. The
reference is `GlmImagePipeline(prior_token_ids=..., prompt_embeds=..., negative_prompt_embeds=...,
latents=...)` (its single step is the pipeline run with num_inference_steps=1, output_type="latent").
Both hold the same random weights (copied through the key maps). Timings are medians of
interleaved repeats; the script also prints how far the outputs are apart.

    python bench/decode.py --size=256 --steps=10 --batch=2 --layers=4 --heads=8 --head_dim=64
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
  p.add_argument("--size", type=int, default=256, help="image height = width in pixels (multiple of 32)")
  p.add_argument("--steps", type=int, default=10, help="denoising steps of the whole decode")
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--text_len", type=int, default=32, help="glyph tokens")
  p.add_argument("--reps", type=int, default=5)
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
from diffusers import AutoencoderKL as TorchVAE  # noqa: E402
from diffusers import FlowMatchEulerDiscreteScheduler, GlmImagePipeline, GlmImageTransformer2DModel  # noqa: E402
from flax import nnx  # noqa: E402

from checkpoints_convert.maps import dit as dit_map  # noqa: E402
from checkpoints_convert.maps import vae as vae_map  # noqa: E402
from glmrl.models.dit import DiTConfig, GlmImageDiT  # noqa: E402
from glmrl.models.vae import AutoencoderKL, VAEConfig  # noqa: E402
from glmrl.sampling import decode, scheduler  # noqa: E402
from bench.timing import interleaved_medians  # noqa: E402
from tests import torch_port  # noqa: E402

GUIDANCE = 1.5


def configs(args) -> tuple[DiTConfig, VAEConfig]:
  """A DiT of the released layout at `--layers` x `--heads` x `--head_dim`, and the released VAE
  layout (4 levels, 16 latent channels, 8x) at a quarter of its widths."""
  dit = DiTConfig(num_layers=args.layers, num_attention_heads=args.heads, attention_head_dim=args.head_dim,
                  text_embed_dim=256, time_embed_dim=256, condition_dim=64, prior_vq_quantizer_codebook_size=1024)
  vae = VAEConfig.full(block_out_channels=(32, 128, 256, 256), latent_channels=dit.in_channels)
  return dit, vae



def main():
  args = ARGS
  if args.size % 32:
    raise ValueError(f"--size={args.size} must be a multiple of 32")
  dit_cfg, vae_cfg = configs(args)
  torch.manual_seed(0)
  t_dit = GlmImageTransformer2DModel.from_config(dit_cfg.to_hf()).eval()
  t_vae = TorchVAE(**{k: v for k, v in vae_cfg.to_hf().items() if not k.startswith("_")}).eval()
  with torch.no_grad():  # zero-initialised projections would make the DiT output trivial
    for p in t_dit.parameters():
      p.add_(0.02 * torch.randn_like(p))
  sched_cfg = scheduler.SchedulerConfig.full()
  ref = GlmImagePipeline(tokenizer=None, processor=None, text_encoder=None, vision_language_encoder=None,
                         vae=t_vae, transformer=t_dit, scheduler=FlowMatchEulerDiscreteScheduler.from_config(
                             sched_cfg.to_hf()))
  ref.set_progress_bar_config(disable=True)
  dit_def, dit_state = nnx.split(torch_port.port(t_dit, GlmImageDiT, dit_cfg, dit_map.RULES))
  vae_def, vae_state = nnx.split(torch_port.port(t_vae, AutoencoderKL, vae_cfg, vae_map.RULES))

  b, side = args.batch, args.size
  rng = np.random.default_rng(0)
  latents = rng.standard_normal((b, dit_cfg.in_channels, side // 8, side // 8)).astype(np.float32)
  grid = rng.integers(0, dit_cfg.prior_vq_quantizer_codebook_size, (b, side // 32, side // 32))
  prior = np.array(decode.upsample_prior_tokens(jnp.asarray(grid)))
  glyph = rng.standard_normal((b, args.text_len, dit_cfg.text_embed_dim)).astype(np.float32)
  neg = rng.standard_normal((b, args.text_len, dit_cfg.text_embed_dim)).astype(np.float32)

  ones = jnp.ones((b, args.text_len), bool)
  cond = decode.Conditioning(jnp.asarray(prior), jnp.asarray(glyph), ones, jnp.asarray(neg), ones)
  size = jnp.tile(jnp.array([[side, side]], jnp.float32), (b, 1))
  crop = jnp.zeros((b, 2), jnp.float32)
  x0 = jnp.asarray(latents)
  full = scheduler.glm_image_schedule(args.steps, side, side, sched_cfg)
  one = scheduler.glm_image_schedule(1, side, side, sched_cfg)

  @jax.jit
  def ours_step(dit_state, x):
    return decode.denoise(nnx.merge(dit_def, dit_state), cond, x, jnp.asarray(one.model_timesteps),
                          jnp.asarray(one.sigmas), GUIDANCE, size, crop)

  def run_ours_step():
    return jax.block_until_ready(ours_step(dit_state, x0))

  def run_ours_decode():
    return jax.block_until_ready(decode.denoise_and_decode(
        dit_def, dit_state, vae_def, vae_state, cond, x0, jnp.asarray(full.model_timesteps),
        jnp.asarray(full.sigmas), GUIDANCE, size, crop))

  kw = dict(prompt_embeds=torch.from_numpy(glyph), negative_prompt_embeds=torch.from_numpy(neg),
            prior_token_ids=torch.from_numpy(prior), latents=torch.from_numpy(latents), height=side, width=side,
            guidance_scale=GUIDANCE)

  def run_ref_step():
    with torch.no_grad():
      return ref(num_inference_steps=1, output_type="latent", **kw).images

  def run_ref_decode():
    with torch.no_grad():
      return ref(num_inference_steps=args.steps, output_type="pt", **kw).images

  compile_s = []
  for fn in (run_ours_step, run_ours_decode):
    t0 = time.perf_counter()
    fn()
    compile_s.append(time.perf_counter() - t0)
  step_diff = float(np.abs(np.asarray(run_ours_step()) - run_ref_step().numpy()).max())
  images, _ = run_ours_decode()
  ref_images = np.round(np.transpose(run_ref_decode().numpy(), (0, 2, 3, 1)) * 255)
  image_diff = int(np.abs(np.asarray(images, np.int32) - ref_images).max())

  ours_step_s, ref_step_s, ours_dec_s, ref_dec_s = interleaved_medians(
      [run_ours_step, run_ref_step, run_ours_decode, run_ref_decode], args.reps)

  n_dit = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(dit_state))
  n_vae = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(vae_state))
  print(f"config: DiT {args.layers} layers, {args.heads}x{args.head_dim} heads ({n_dit / 1e6:.1f}M params); "
        f"VAE block_out_channels={vae_cfg.block_out_channels} ({n_vae / 1e6:.1f}M params); batch {b}, "
        f"{side}x{side} px ({(side // 16) ** 2} image tokens), {args.text_len} glyph tokens, "
        f"{args.steps} steps, guidance {GUIDANCE}")
  print(f"machine: jax {jax.devices()[0].platform} x{jax.device_count()}, {os.cpu_count()} cpus, threads: "
        f"{THREADS}, load average {os.getloadavg()[0]:.1f}")
  print(f"ours, first calls (compile): step {compile_s[0]:.2f} s, decode {compile_s[1]:.2f} s")
  print(f"max |ours - diffusers|: one-step latents {step_diff:.2e}, decoded uint8 images {image_diff}")
  print(f"medians of {args.reps} interleaved repeats:")
  print(f"{'':28s}{'ours (jit)':>12s}{'diffusers':>12s}{'diffusers/ours':>16s}")
  for name, ours, theirs in (("one step (both CFG branches)", ours_step_s, ref_step_s),
                             (f"whole decode ({args.steps} steps + VAE)", ours_dec_s, ref_dec_s)):
    print(f"{name:28s}{ours * 1e3:>10.1f}ms{theirs * 1e3:>10.1f}ms{theirs / ours:>15.2f}x")


if __name__ == "__main__":
  main()
