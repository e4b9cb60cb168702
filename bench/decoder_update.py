"""Decoder (Flow-GRPO) update cost per trained timestep, what the SDE window saves, and the torch reference.

    python -m bench.decoder_update [--batch 4 --size 256 --layers 4 --heads 4 --head_dim 32 --windows 1,2,4,10
                                    --steps 10 --window 2 --reps 15 --torch_threads 2 --single_thread --no_torch
                                    --dtype bfloat16 --attention cudnn]

On a random DiT somewhat bigger than `DiTConfig.tiny` with DiT LoRA (DIT_TARGETS), float32 parameters computing
in --dtype (torch: autocast to it), one batch of B samples at R x R pixels, both sides on the same device (torch on
CUDA when JAX runs on a GPU, `bench/accel.py`), timed in one run (median of --reps, interleaved, after one untimed
compile call):
1. the jitted `glmrl.policy.flow_grpo.update` (first=True: old = stop_gradient(new)) for each SDE window size W, per
   call and per trained timestep (/ W), also as a multiple of one CFG-guided velocity (two DiT passes): a sampling
   step's forward;
2. the rollout's denoise + decode (`decode.denoise_and_decode`, T steps) with an SDE window of --window steps
   vs every step SDE (the same T guided forwards either way), and a training step = rollout + update for both;
3. the same per-timestep work in PyTorch as Flow-GRPO's train_sd3.py does it: diffusers
   `GlmImageTransformer2DModel` of the same config with a PEFT LoRA on the same layers, one CFG forward (cond and
   uncond concatenated into one 2B batch, as train_sd3), the Gaussian log-prob of the recorded step (mean over
   latent dims, sd3_sde_with_logprob), the clipped surrogate and backward; its optimizer step is not timed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=4, help="samples B")
  p.add_argument("--size", type=int, default=256, help="image height = width in pixels (multiple of 32)")
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--head_dim", type=int, default=32)
  p.add_argument("--text_len", type=int, default=16, help="glyph tokens")
  p.add_argument("--lora_rank", type=int, default=8)
  p.add_argument("--windows", default="1,2,4,10", help="SDE window sizes W of the timed updates")
  p.add_argument("--steps", type=int, default=10, help="denoising steps T of the rollout")
  p.add_argument("--window", type=int, default=2, help="SDE window of the windowed rollout")
  p.add_argument("--window_start", type=int, default=0, help="its (fixed) first step")
  p.add_argument("--reps", type=int, default=15)
  p.add_argument("--torch_threads", type=int, default=2)
  p.add_argument("--single_thread", action="store_true",
                 help="one intra-op thread for XLA and torch (fairer on a machine other processes load: torch's "
                      "OpenMP team stalls when one of its threads is descheduled)")
  p.add_argument("--no_torch", action="store_true", help="skip the diffusers + PEFT column")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype, both sides")
  p.add_argument("--attention", default="xla", help="our DiT's attention kernel (attention.IMPLS)")
  p.add_argument("--cfg_batched", action="store_true", help="our CFG branches as one forward of 2B (as torch's)")
  args = p.parse_args(argv)
  if args.single_thread:
    args.torch_threads = 1
  return args


ARGS = parse_args()
from bench import accel, threads  # noqa: E402

THREADS = threads.limit(1 if ARGS.single_thread else 0)  # before jax starts

import glmrl  # noqa: E402,F401

import flax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bench.timing import interleaved_medians  # noqa: E402
from glmrl.models import lora as lora_lib  # noqa: E402
from glmrl.models.dit import DiTConfig, GlmImageDiT  # noqa: E402
from glmrl.models.vae import AutoencoderKL, VAEConfig  # noqa: E402
from glmrl.sampling import decode, scheduler  # noqa: E402
from glmrl.policy import accumulate  # noqa: E402
from glmrl.policy import flow_grpo as decoder_policy  # noqa: E402
from glmrl.policy import optimizer as optimizer_lib  # noqa: E402

# Flow-GRPO's defaults, as configs/common.py (decoder.*, sampling.guidance_scale).
NOISE, GUIDANCE, CLIP, ADV_CLIP = 0.7, 1.5, 1e-4, 5.0
TORCH_TARGETS = r".*transformer_blocks\.\d+\.(attn1\.(to_q|to_k|to_v|to_out\.0)|ff\.net\.(0\.proj|2))"


def dit_config(args) -> DiTConfig:
  return DiTConfig.tiny(in_channels=16, out_channels=16, num_layers=args.layers, num_attention_heads=args.heads,
                        attention_head_dim=args.head_dim, text_embed_dim=64, time_embed_dim=64, condition_dim=16,
                        prior_vq_quantizer_codebook_size=256, dtype=accel.jax_dtype(args.dtype),
                        attention_impl=args.attention, cfg_batched=args.cfg_batched)


def count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


# ----------------------------------------------------------------------------------------------- inputs

def make_inputs(cfg: DiTConfig, args) -> dict:
  """Numpy inputs shared by both sides: conditioning, initial noise, the T-step schedule."""
  rng = np.random.default_rng(0)
  b, r = args.batch, args.size
  grid_Bxgxg = rng.integers(0, cfg.prior_vq_quantizer_codebook_size, size=(b, r // 32, r // 32))
  sched = scheduler.glm_image_schedule(args.steps, r, r, scheduler.SchedulerConfig.full())
  return dict(
      prior_ids_BxX=np.asarray(decode.upsample_prior_tokens(jnp.asarray(grid_Bxgxg))),
      glyph_BxSxD=rng.standard_normal((b, args.text_len, cfg.text_embed_dim)).astype(np.float32),
      neg_glyph_BxSxD=rng.standard_normal((b, args.text_len, cfg.text_embed_dim)).astype(np.float32),
      noise_BxCxhxw=rng.standard_normal((b, cfg.in_channels, r // 8, r // 8)).astype(np.float32),
      size_Bx2=np.tile(np.array([[r, r]], np.float32), (b, 1)), crop_Bx2=np.zeros((b, 2), np.float32),
      timesteps_T=np.asarray(sched.model_timesteps, np.float32), sigmas_T1=np.asarray(sched.sigmas, np.float32),
      advantages_B=rng.standard_normal(b).astype(np.float32))


def conditioning(x: dict) -> decode.Conditioning:
  ones_BxS = jnp.ones(x["glyph_BxSxD"].shape[:2], bool)
  return decode.Conditioning(jnp.asarray(x["prior_ids_BxX"]), jnp.asarray(x["glyph_BxSxD"]), ones_BxS,
                             jnp.asarray(x["neg_glyph_BxSxD"]), ones_BxS)


# ----------------------------------------------------------------------------------------------- ours (JAX)

def build_dit(cfg: DiTConfig, rank: int):
  """(graphdef, adapters, base) of a random DiT with LoRA on DIT_TARGETS."""
  dit = GlmImageDiT(cfg, rngs=nnx.Rngs(0))
  lora_lib.apply_lora(dit, lora_lib.LoraConfig(rank=rank, alpha=2.0 * rank, targets=lora_lib.DIT_TARGETS),
                      nnx.Rngs(1))
  return nnx.split(dit, lora_lib.LoraParam, ...)


@functools.partial(jax.jit, static_argnums=0)
def guided_forward(graphdef, adapters, base, cond, x_BxCxhxw, t, size_Bx2, crop_Bx2):
  """One sampling step's forward: the CFG-guided velocity (two DiT passes)."""
  return decode.guided_velocity(nnx.merge(graphdef, adapters, base), cond, x_BxCxhxw, t, GUIDANCE, size_Bx2,
                                crop_Bx2)


def build_vae(cfg: DiTConfig):
  """(graphdef, state) of a tiny random VAE (8x downsampling) for the DiT's latent channels."""
  c = cfg.in_channels
  vae_cfg = VAEConfig.tiny(block_out_channels=(8, 8, 16, 16), latent_channels=c, latents_mean=(0.0,) * c,
                           latents_std=(1.0,) * c)
  return nnx.split(AutoencoderKL(vae_cfg, rngs=nnx.Rngs(2)))


def rollout_fn(graphdef, adapters, base, vae_def, vae_state, x: dict, window: int, start: int):
  """A call of denoise + decode (T steps, `window` SDE steps from `start`); returns its Trajectory."""
  keys_B = jax.random.split(jax.random.key(3), x["noise_BxCxhxw"].shape[0])
  args = (graphdef, (adapters, base), vae_def, vae_state, conditioning(x), jnp.asarray(x["noise_BxCxhxw"]),
          jnp.asarray(x["timesteps_T"]), jnp.asarray(x["sigmas_T1"]), GUIDANCE, jnp.asarray(x["size_Bx2"]),
          jnp.asarray(x["crop_Bx2"]), None, decode.SdeWindow(NOISE, window), keys_B, start)
  return lambda: jax.block_until_ready(decode.denoise_and_decode(*args))[2]


def decoder_rollout(traj: decode.Trajectory, x: dict, start: int, size: int) -> decoder_policy.FlowRollout:
  """The update's batch: `size` recorded steps from `start` of an all-SDE trajectory ([T, B, ...])."""
  cut_BxW = lambda a: jnp.swapaxes(a[start:start + size], 0, 1)
  b = x["noise_BxCxhxw"].shape[0]
  return decoder_policy.FlowRollout(
      cond=conditioning(x), target_size=jnp.asarray(x["size_Bx2"]), crop=jnp.asarray(x["crop_Bx2"]),
      latents_before=cut_BxW(traj.latents_before), latents_after=cut_BxW(traj.latents_after),
      sampler_logp=cut_BxW(traj.sampler_logp), old_logp=jnp.full((b, size), jnp.nan),
      advantages=jnp.asarray(x["advantages_B"]), mask=jnp.ones((b, size)))


class Updater:
  """The trainer's jitted decoder update (params and optimizer state donated, carried from call to call)."""

  def __init__(self, graphdef, adapters, base):
    optim = dict(learning_rate=3e-4, warmup_steps=0, weight_decay=1e-4, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0)
    tx, schedule = optimizer_lib.make_optimizer(argparse.Namespace(**optim), num_steps=1000)
    spec = decoder_policy.FlowSpec(noise_level=NOISE, guidance_scale=GUIDANCE, clip_range=CLIP,
                                    adv_clip_max=ADV_CLIP, beta=0.0, micro_batches=1, reference="adapters_off")
    self.fn = accumulate.jit_update(decoder_policy.update, graphdef, spec=spec, tx=tx, schedule=schedule)
    self.base = base
    self.params, self.opt_state = adapters, optimizer_lib.init(tx, adapters)

  def call(self, rollout, window):
    self.params, self.opt_state, metrics, _ = self.fn(self.params, self.base, self.opt_state,
                                                      decoder_policy.FlowBatch(rollout, window), None, True)
    jax.block_until_ready((self.params, metrics))


# ----------------------------------------------------------------------------------------------- reference (torch)

def torch_timestep_fn(cfg: DiTConfig, rank: int, x: dict, traj: decode.Trajectory, threads: int, dtype: str):
  """(one trained timestep as train_sd3.py, its CFG forward alone (no grad: a sampling step), the PEFT model's
  LoRA parameter count); raises if the model cannot be built or run."""
  import torch
  from diffusers import GlmImageTransformer2DModel
  from peft import LoraConfig, get_peft_model

  torch.set_num_threads(threads)
  device = accel.torch_device()
  torch.manual_seed(0)
  model = get_peft_model(GlmImageTransformer2DModel.from_config(cfg.to_hf()),
                         LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=True,
                                    target_modules=TORCH_TARGETS))
  model.to(device).train()
  lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
  t = lambda a: torch.from_numpy(np.array(a)).to(device)
  two = lambda a: torch.cat([t(a), t(a)])
  b = x["noise_BxCxhxw"].shape[0]
  glyph_2BxSxD = torch.cat([t(x["neg_glyph_BxSxD"]), t(x["glyph_BxSxD"])])  # uncond first, as train_sd3
  ids_2BxX = two(x["prior_ids_BxX"]).long()
  drop_2BxX = torch.arange(2 * b, device=device)[:, None].expand_as(ids_2BxX) < b  # every prior token dropped in uncond
  size_2Bx2, crop_2Bx2 = two(x["size_Bx2"]), two(x["crop_Bx2"])
  x_BxCxhxw, x_next_BxCxhxw = t(traj.latents_before[0]), t(traj.latents_after[0])
  adv_B = t(x["advantages_B"]).clamp(-ADV_CLIP, ADV_CLIP)
  sigma, sigma_next = float(x["sigmas_T1"][0]), float(x["sigmas_T1"][1])
  timestep_2B = torch.full((2 * b,), float(x["timesteps_T"][0]), device=device)
  autocast = lambda: torch.autocast(device, dtype=accel.torch_dtype(dtype), enabled=dtype != "float32")

  def logprob_B():
    with autocast():
      out = model(hidden_states=torch.cat([x_BxCxhxw, x_BxCxhxw]), encoder_hidden_states=glyph_2BxSxD,
                  prior_token_id=ids_2BxX, prior_token_drop=drop_2BxX, timestep=timestep_2B, target_size=size_2Bx2,
                  crop_coords=crop_2Bx2, return_dict=False)[0]
    v_uncond, v_cond = out.float().chunk(2)
    v = v_uncond + GUIDANCE * (v_cond - v_uncond)
    # sd3_sde_with_logprob.py: sigma == 1 takes sigmas[1] in 1 - sigma.
    dt = sigma_next - sigma
    std_t = math.sqrt(sigma / (1 - (sigma_next if sigma == 1 else sigma))) * NOISE
    mean = x_BxCxhxw * (1 + std_t ** 2 / (2 * sigma) * dt) + v * (1 + std_t ** 2 * (1 - sigma) / (2 * sigma)) * dt
    step_std = std_t * math.sqrt(-dt)
    logp = (-(x_next_BxCxhxw - mean) ** 2 / (2 * step_std ** 2) - math.log(step_std)
            - math.log(math.sqrt(2 * math.pi)))
    return logp.mean(dim=(1, 2, 3))

  def forward():
    with torch.no_grad():
      return logprob_B()

  old_B = forward()  # this model's own sampler log-probs: ratio 1, as our first update

  def step():
    ratio = torch.exp(logprob_B() - old_B)
    loss = torch.maximum(-adv_B * ratio, -adv_B * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
    loss.backward()

  return accel.synced(step, device), accel.synced(forward, device), lora


# ----------------------------------------------------------------------------------------------- report

def versions() -> str:
  out = [f"jax {jax.__version__}", f"flax {flax.__version__}"]
  for name in ("torch", "diffusers", "peft"):
    try:
      out.append(f"{name} {__import__(name).__version__}")
    except ImportError:
      out.append(f"{name} missing")
  return ", ".join(out)


def report(args, cfg, sizes, ms, compile_s, torch_note):
  windows = [int(w) for w in args.windows.split(",")]
  fwd, t = ms["guided_forward"], args.steps
  # (name, ms per call, trained timesteps per call or None, the same framework's guided forward)
  rows = [("guided forward (CFG: 2 DiT passes of B samples)", fwd, None, fwd)]
  rows += [(f"update W={w} (first=True)", ms[f"update_W{w}"], w, fwd) for w in windows]
  rows += [(f"rollout T={t}, SDE window {args.window} from step {args.window_start} (+ VAE decode)",
            ms["rollout_window"], None, fwd),
           (f"rollout T={t}, all {t} steps SDE (+ VAE decode)", ms["rollout_all_sde"], None, fwd)]
  if "torch_timestep" in ms:
    tfwd = ms["torch_guided_forward"]
    rows += [("torch: guided forward (CFG as one 2B batch, no grad)", tfwd, None, tfwd),
             ("torch: guided forward + log-prob + loss + backward", ms["torch_timestep"], 1, tfwd)]
  print(f"\ndevices: {jax.devices()}; torch on {accel.torch_device()}; {versions()}; "
        f"threads: {THREADS}; torch threads {args.torch_threads}")
  print(f"DiT {cfg.num_layers} layers, {cfg.num_attention_heads}x{cfg.attention_head_dim} heads, "
        f"{sizes['dit_params'] / 1e6:.2f}M params, LoRA rank {args.lora_rank} on DIT_TARGETS: "
        f"{sizes['lora_params']} params (torch PEFT: {sizes.get('torch_lora_params', '-')}); float32 parameters, "
        f"{args.dtype} compute, attention {args.attention}, "
        f"CFG branches {'as one forward' if args.cfg_batched else 'as two forwards'}")
  print(f"batch {args.batch}, {args.size}x{args.size} px ({(args.size // 16) ** 2} image tokens, "
        f"{args.text_len} glyph tokens); median of {args.reps}, interleaved; first calls (compile): "
        + ", ".join(f"{k} {v:.1f} s" for k, v in compile_s.items()))
  print("\n| measurement | ms / call | ms / trained timestep | x guided forward (same framework) |\n"
        "|---|---:|---:|---:|")
  for name, ms_call, per, base in rows:
    ms_step = ms_call / per if per else None
    print(f"| {name} | {ms_call:.1f} | {'' if per is None else f'{ms_step:.1f}'} | "
          f"{(ms_step or ms_call) / base:.2f} |")
  w_small, w_all = args.window, args.steps
  summary = {}
  if f"update_W{w_small}" in ms and f"update_W{w_all}" in ms:
    step_small = ms["rollout_window"] + ms[f"update_W{w_small}"]
    step_all = ms["rollout_all_sde"] + ms[f"update_W{w_all}"]
    summary = dict(step_window_ms=step_small, step_all_sde_ms=step_all,
                   update_ratio=ms[f"update_W{w_all}"] / ms[f"update_W{w_small}"], step_ratio=step_all / step_small)
    print(f"\nrollout, all-SDE / window: {ms['rollout_all_sde'] / ms['rollout_window']:.2f}x (one guided forward "
          "per step either way)")
    print(f"training step (rollout + update): SDE window {w_small}: {step_small:.0f} ms, all {w_all} steps SDE: "
          f"{step_all:.0f} ms; all-SDE / window: step {summary['step_ratio']:.2f}x, "
          f"update alone {summary['update_ratio']:.2f}x")
  if "torch_timestep" in ms:
    ratios = {w: ms[f"update_W{w}"] / w / ms["torch_timestep"] for w in windows}
    summary["ours_over_torch_per_timestep"] = ratios
    summary["ours_over_torch_forward"] = ms["guided_forward"] / ms["torch_guided_forward"]
    print(f"ours / torch: guided forward {summary['ours_over_torch_forward']:.2f}; per trained timestep "
          + ", ".join(f"W={w}: {r:.2f}" for w, r in ratios.items()))
  else:
    print(f"torch reference skipped: {torch_note}")
  print(json.dumps(dict(args=vars(args), devices=[str(d) for d in jax.devices()], versions=versions(), **sizes,
                        ms=ms, compile_s=compile_s, **summary, torch_note=torch_note)))


# ----------------------------------------------------------------------------------------------- main

def first_call(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def main():
  args = ARGS
  windows = [int(w) for w in args.windows.split(",")]
  if args.size % 32 or max(windows) > args.steps or args.window_start + args.window > args.steps:
    raise SystemExit("--size must be a multiple of 32 and every window must fit in --steps")
  cfg = dit_config(args)
  x = make_inputs(cfg, args)
  graphdef, adapters, base = build_dit(cfg, args.lora_rank)
  sizes = dict(dit_params=count(base) + count(adapters), lora_params=count(adapters))
  ms, compile_s, fns = {}, {}, {}

  cond, x0 = conditioning(x), jnp.asarray(x["noise_BxCxhxw"])
  t0_, size_, crop_ = jnp.asarray(x["timesteps_T"][0]), jnp.asarray(x["size_Bx2"]), jnp.asarray(x["crop_Bx2"])
  fns["guided_forward"] = lambda: jax.block_until_ready(
      guided_forward(graphdef, adapters, base, cond, x0, t0_, size_, crop_))
  vae_def, vae_state = build_vae(cfg)
  fns["rollout_window"] = rollout_fn(graphdef, adapters, base, vae_def, vae_state, x, args.window, args.window_start)
  fns["rollout_all_sde"] = rollout_fn(graphdef, adapters, base, vae_def, vae_state, x, args.steps, 0)
  for name in list(fns):
    compile_s[name] = first_call(fns[name])
  traj = fns["rollout_all_sde"]()  # [T, B, ...]: every step's x_t, x_{t+1}

  updater = Updater(graphdef, jax.tree.map(jnp.copy, adapters), base)
  timesteps, sigmas = jnp.asarray(x["timesteps_T"]), jnp.asarray(x["sigmas_T1"])
  for w in windows:
    start = min(args.window_start, args.steps - w)
    rollout, window = decoder_rollout(traj, x, start, w), decoder_policy.Window.at(timesteps, sigmas, start, w)
    fns[f"update_W{w}"] = functools.partial(updater.call, rollout, window)
    compile_s[f"update_W{w}"] = first_call(fns[f"update_W{w}"])

  torch_note = "--no_torch"
  if not args.no_torch:
    try:
      step, forward, sizes["torch_lora_params"] = torch_timestep_fn(cfg, args.lora_rank, x, traj,
                                                                    args.torch_threads, args.dtype)
      fns["torch_guided_forward"], fns["torch_timestep"] = forward, step
      compile_s["torch_timestep"] = first_call(step)
      torch_note = ""
    except Exception as e:  # noqa: BLE001 -- reported, the column is skipped (no stand-in)
      fns.pop("torch_timestep", None), fns.pop("torch_guided_forward", None)
      torch_note = f"diffusers GlmImageTransformer2DModel + PEFT could not run this config: {type(e).__name__}: {e}"

  names = list(fns)
  for name, s in zip(names, interleaved_medians([fns[n] for n in names], args.reps)):
    ms[name] = s * 1e3
  report(args, cfg, sizes, ms, compile_s, torch_note)


if __name__ == "__main__":
  main()
