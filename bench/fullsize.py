"""GLM-Image at its released size on one accelerator: the AR sampler, the DiT decode and a training step of the
released recipes, against the hardware's limits and diffusers.

    python bench/fullsize.py [--size=full] [--stages=train,ar,dit] [--out=DIR]
    python bench/fullsize.py --size=tiny   # every stage on a CPU, about two minutes (tests/bench/test_fullsize.py)

The models have the released configs' sizes (`glm_image.preset_configs("full")`) and random weights made on the
device in the recipes' dtypes (bfloat16: the LoRA recipes' frozen bases); no checkpoint is read. Stages:

- `ar`: the jitted KV-cache sampler on the released 1024^2 text-to-image layout (preview grid, target grid, end
  token) at each of `--batches`: tokens/s, ms per decoding step, and the step's HBM roofline: the bytes it must
  read (the weights a token uses: every decoder layer, the final norm and the head, not the embedding table; and
  the KV cache rows of the context so far, at its mean length) over the chip's HBM bandwidth, as a percentage.
- `dit`: one CFG step (both branches, the guidance) of the 1024^2 DiT, a whole `--dit_steps` decode with the VAE
  (the pipeline's program) and the VAE decode alone, for each kernel in `--attention`; beside them diffusers'
  `GlmImageTransformer2DModel` holding the same weights on the same device (torch with CUDA on a GPU, the CPU on a
  CPU), its CFG step on the same inputs, and the largest difference of the two velocities.
- `train`: `main.py` as users run it (`bench/fullsize_recipe.py`: the recipe with random weights and rewards that
  need no weights) for `--train_steps` steps of each recipe in `--recipes`; the last step's seconds per stage
  (`time/sampling`, `time/decode`, `time/reward`, `time/update`) and the peak device memory (`memory/peak_gib`,
  where the backend reports it). `--prompts` x `--group` (the decoupled recipe: x 4 decoder samples per grid) sets
  the batch; `--train_flags` passes more `--config.` flags (e.g. micro-batches) to both recipes.
- `compile`: `main.py --mode=compile` of each recipe at the train stage's flags for `--compile_topology` (e.g.
  h200-1, the lent GPU's kind; on the host's CPU, no device taken): the compile report's peak per GPU and verdict,
  and beside the train stage's measured peak their ratio.

The train stage runs first, as a child process, before this process takes the device. Results are printed as
tables and written to `--out`/fullsize.json. Timings are medians of `--reps` calls after one untimed call (which
compiles; its time is reported).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import glmrl  # noqa: E402,F401  (first: its JAX settings)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

# HBM bytes per second and dense bfloat16 FLOP/s of one chip, by a part of its `device_kind`, for the GPUs that
# --mode=compile does not target (NVIDIA's data sheets: H100 PCIe / NVL); the H100 SXM, the H200 and the TPUs by
# their exact kind from glmrl/programs/topology.py.
GPU_CHIPS = (("H100 NVL", 3.9e12, 835e12), ("H100 PCIe", 2.0e12, 756e12))
SIZES = {
    # size: (recipe config argument suffix, default batches, default DiT steps, train defaults)
    "full": ("", "1,8,16,32", 50, dict(prompts=1, group=4, dit_steps=50)),
    "tiny": (",tiny", "1,2", 4, dict(prompts=2, group=2, dit_steps=4)),
}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="full", choices=sorted(SIZES))
  p.add_argument("--stages", default="train,ar,dit", help="comma-separated: train, ar, dit, compile")
  p.add_argument("--compile_topology", default="", help="compile stage: the target, e.g. h200-1")
  p.add_argument("--batches", default="", help="AR sampler batches (default 1,8,16,32; tiny: 1,2)")
  p.add_argument("--dit_steps", type=int, default=0, help="steps of the whole decode (default 50; tiny: 4)")
  p.add_argument("--dit_batch", type=int, default=1, help="images per DiT call")
  p.add_argument("--attention", default="", help="DiT kernels (default xla,cudnn on a GPU, xla elsewhere)")
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--recipes", default="lora,decoupled", help="train stage: bench/fullsize_recipe.py arguments")
  p.add_argument("--prompts", type=int, default=0, help="train stage: prompts per step (default 1; tiny: 2)")
  p.add_argument("--group", type=int, default=0, help="train stage: AR group size (default 4; tiny: 2)")
  p.add_argument("--train_steps", type=int, default=2, help="train stage: steps (the last one is reported)")
  p.add_argument("--train_flags", default="", help="train stage: more main.py flags, space-separated")
  p.add_argument("--hbm_gbps", type=float, default=0, help="HBM GB/s of one chip when its kind is not known")
  p.add_argument("--out", default="/tmp/glmrl_fullsize")
  args = p.parse_args(argv)
  suffix, batches, dit_steps, train = SIZES[args.size]
  args.recipe_suffix = suffix
  args.batches = [int(b) for b in (args.batches or batches).split(",")]
  args.dit_steps = args.dit_steps or dit_steps
  args.prompts = args.prompts or train["prompts"]
  args.group = args.group or train["group"]
  args.train_dit_steps = train["dit_steps"]
  args.stages = [s for s in args.stages.split(",") if s]
  unknown = set(args.stages) - {"train", "ar", "dit", "compile"}
  if unknown:
    p.error(f"--stages: unknown {sorted(unknown)}; expected train, ar, dit, compile")
  if "compile" in args.stages and not args.compile_topology:
    p.error("--stages=compile needs --compile_topology, e.g. h200-1")
  return args


def chip_rates(hbm_gbps: float = 0) -> tuple[float | None, float | None]:
  """(HBM bytes/s, bf16 FLOP/s) of this process's first device, None where not known."""
  from glmrl.programs import topology  # pylint: disable=import-outside-toplevel

  kind = jax.devices()[0].device_kind
  hbm, flops = None, None
  for name, bandwidth, peak in GPU_CHIPS:
    if name in kind:
      hbm, flops = bandwidth, peak
      break
  if kind in topology.DEVICE_KINDS:
    chip = topology.CHIPS[topology.DEVICE_KINDS[kind]]
    hbm, flops = chip.hbm_bandwidth, chip.peak_bf16_flops
  return (hbm_gbps * 1e9 if hbm_gbps else hbm), flops


def timed(fn, reps: int) -> tuple[float, float]:
  """(median seconds of `reps` calls, seconds of the first call, which compiles); `fn` blocks until done."""
  t0 = time.perf_counter()
  fn()
  first = time.perf_counter() - t0
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times), first


def table(header: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
  return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


# ------------------------------------------------------------------------------------------------ models
def run_config(args, recipe: str = "lora"):
  from bench import fullsize_recipe  # pylint: disable=import-outside-toplevel

  return fullsize_recipe.get_config(recipe + args.recipe_suffix)


def build_pipeline(args, components: tuple[str, ...], dit_attention: str | None = None):
  """The recipe's GlmImagePipeline holding random `components` (the others left out) on this process's device."""
  from glmrl.programs import plan  # pylint: disable=import-outside-toplevel
  from glmrl.models import glm_image  # pylint: disable=import-outside-toplevel
  from glmrl.sampling.pipeline import GlmImagePipeline  # pylint: disable=import-outside-toplevel
  from glmrl.train import setup  # pylint: disable=import-outside-toplevel

  config = run_config(args)
  if dit_attention:
    config.model.dit_attention = dit_attention
  configs = plan.model_configs(config)
  texts = open(config.data.prompts_file).read().splitlines()
  processor, glyph_tokenizer = setup.processors(config, configs, texts)
  models = {}
  for i, name in enumerate(glm_image.COMPONENTS):
    cfg = getattr(configs, name)
    models[name] = (glm_image.build(name, cfg, seed=i) if name in components
                    else (glm_image.abstract_model(name, cfg)[0], None))
  return GlmImagePipeline(configs, models, processor, glyph_tokenizer, setup.pipeline_spec(config)), texts


def param_bytes(state, keep=lambda path: True) -> int:
  return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
             for path, v in jax.tree_util.tree_leaves_with_path(state) if keep(jax.tree_util.keystr(path)))


# ------------------------------------------------------------------------------------------------ AR
def ar_stage(args, hbm) -> list[dict]:
  pipeline, texts = build_pipeline(args, ("ar",))
  cfg = pipeline.configs.ar
  state = pipeline.models["ar"][1]
  # What a decoding step reads once whatever the batch: every decoder layer, the final norm, the head (the
  # embedding table gives B rows; the vision tower and the VQ tokenize condition images, none here).
  weights = param_bytes(state, lambda p: "'text'" in p and "'embed'" not in p or "'lm_head'" in p)
  kv_per_token = 2 * cfg.text.num_hidden_layers * cfg.text.num_key_value_heads * cfg.text.head_dim * \
      np.dtype(cfg.dtype).itemsize
  rows = []
  for b in args.batches:
    prepared = pipeline.prepare([texts[i % len(texts)] for i in range(b)])
    layout = prepared.batch.layout
    n_new, prompt_len = layout.num_new_tokens, prepared.input_ids.shape[1]
    calls = itertools.count()

    def sample():
      keys = jax.random.split(jax.random.key(next(calls)), b)
      jax.block_until_ready(pipeline.sample_tokens(prepared, keys, 1).tokens)

    seconds, first = timed(sample, args.reps)
    step_s = seconds / n_new
    step_bytes = weights + b * kv_per_token * (prompt_len + n_new / 2)
    row = dict(batch=b, new_tokens=n_new, prompt_tokens=prompt_len, seconds=seconds, compile_s=first - seconds,
               tokens_per_s=b * n_new / seconds, ms_per_step=1e3 * step_s, bytes_per_step=step_bytes,
               weight_bytes=weights)
    if hbm:
      row.update(roofline_ms_per_step=1e3 * step_bytes / hbm, roofline_pct=100 * step_bytes / hbm / step_s)
    rows.append(row)
  base = rows[0]["tokens_per_s"]
  for row in rows:
    row["speedup_vs_first"] = row["tokens_per_s"] / base
  return rows


def print_ar(rows):
  print(f"\nAR sampler: {rows[0]['new_tokens']} new tokens per sample after {rows[0]['prompt_tokens']} prompt "
        f"tokens; a step reads {rows[0]['weight_bytes'] / 2**20:,.1f} MiB of weights + its KV cache rows")
  print(table(["batch", "tokens/s", f"x batch {rows[0]['batch']}", "ms per step", "roofline ms", "% of roofline",
               "compile s"],
              [[r["batch"], f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_first']:.2f}", f"{r['ms_per_step']:.2f}",
                f"{r['roofline_ms_per_step']:.2f}" if "roofline_pct" in r else "n/a",
                f"{r['roofline_pct']:.0f}%" if "roofline_pct" in r else "n/a", f"{r['compile_s']:.1f}"]
               for r in rows]))


# ------------------------------------------------------------------------------------------------ DiT
def dit_inputs(pipeline, batch: int, seed: int = 0):
  """Pipeline-shaped inputs: the target grid's upsampled prior tokens, glyph and negative glyph embeddings of
  the spec's padded length (all valid), noise latents, timestep, target size and crop."""
  from glmrl.sampling import decode  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(seed)
  cfg, spec = pipeline.configs.dit, pipeline.spec
  grid = rng.integers(0, cfg.prior_vq_quantizer_codebook_size, (batch, spec.height // 32, spec.width // 32))
  glyph = rng.standard_normal((2, batch, spec.glyph_pad, cfg.text_embed_dim)).astype(np.float32)
  mask = jnp.ones((batch, spec.glyph_pad), bool)
  cond = decode.Conditioning(decode.upsample_prior_tokens(jnp.asarray(grid, jnp.int32)), jnp.asarray(glyph[0]),
                             mask, jnp.asarray(glyph[1]), mask)
  latents = jnp.asarray(rng.standard_normal((batch, *pipeline.latent_shape)), jnp.float32)
  size = jnp.tile(jnp.array([[spec.height, spec.width]], jnp.float32), (batch, 1))
  return cond, latents, size, jnp.zeros((batch, 2), jnp.float32)


def dit_stage(args, flops_peak) -> dict:
  from glmrl.models import glm_image  # pylint: disable=import-outside-toplevel
  from glmrl.sampling import decode  # pylint: disable=import-outside-toplevel

  attention = args.attention.split(",") if args.attention else (
      ["xla", "cudnn"] if jax.default_backend() == "gpu" else ["xla"])
  pipeline, _ = build_pipeline(args, ("dit", "vae"))
  spec = pipeline.spec
  cond, latents, size, crop = dit_inputs(pipeline, args.dit_batch)
  timesteps, sigmas = pipeline.schedule(args.dit_steps)
  t = float(timesteps[0])
  vae_def, vae_state = pipeline.models["vae"]
  dit_state = pipeline.models["dit"][1]
  out = dict(batch=args.dit_batch, height=spec.height, width=spec.width, steps=args.dit_steps,
             guidance=spec.guidance_scale, kernels={})
  velocities = {}
  for impl in attention:
    dit_cfg = dataclasses.replace(pipeline.configs.dit, attention_impl=None if impl == "xla" else impl)
    dit_def = glm_image.abstract_model("dit", dit_cfg)[0]

    @jax.jit
    def step(state, latents, dit_def=dit_def):
      return decode.guided_velocity(decode.merge_dit(dit_def, state), cond, latents, t, spec.guidance_scale,
                                    size, crop)

    step_flops = (step.lower(dit_state, latents).compile().cost_analysis() or {}).get("flops")
    step_s, step_first = timed(lambda: step(dit_state, latents).block_until_ready(), args.reps)
    velocities[impl] = np.asarray(step(dit_state, latents), np.float32)

    def whole(dit_def=dit_def):
      images, _ = decode.denoise_and_decode(dit_def, dit_state, vae_def, vae_state, cond, latents, timesteps,
                                            sigmas, spec.guidance_scale, size, crop)
      jax.block_until_ready(images)

    decode_s, decode_first = timed(whole, max(1, args.reps // 2))
    row = dict(step_s=step_s, step_compile_s=step_first - step_s, decode_s=decode_s,
               decode_compile_s=decode_first - decode_s, step_flops=step_flops)
    if step_flops and flops_peak:
      row["step_mfu_pct"] = 100 * step_flops / step_s / flops_peak
    out["kernels"][impl] = row
  vae = jax.jit(lambda state, latents: decode.decode_images(vae_def, state, latents))
  out["vae_s"], _ = timed(lambda: vae(vae_state, latents).block_until_ready(), args.reps)
  out.update(diffusers_step(pipeline, cond, latents, size, crop, t, args.reps, velocities))
  return out


def diffusers_step(pipeline, cond, latents, size, crop, t, reps, velocities) -> dict:
  """diffusers' CFG step on the same weights and inputs, on JAX's device kind; {} without torch/diffusers."""
  try:
    import torch
    from diffusers import GlmImageTransformer2DModel

    from bench import accel
  except ImportError as e:
    return {"diffusers": f"not run: {e}"}
  from checkpoints_convert.maps.dit import RULES  # pylint: disable=import-outside-toplevel
  from checkpoints_convert.rules import KeyMap, flax_path_str  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  device, cfg = accel.torch_device(), pipeline.configs.dit
  dtype = {jnp.dtype(jnp.bfloat16): torch.bfloat16, jnp.dtype(jnp.float32): torch.float32}[jnp.dtype(cfg.dtype)]
  default_dtype = torch.get_default_dtype()
  torch.set_default_dtype(dtype)  # made in the compared dtype on the device: no float32 copy of 7B weights
  try:
    with torch.device(device):
      ref = GlmImageTransformer2DModel.from_config(cfg.to_hf()).eval()
  finally:
    torch.set_default_dtype(default_dtype)
  keymap, weights = KeyMap(RULES), {}
  for path, value in nnx.to_flat_state(pipeline.models["dit"][1]):
    hf_key, transform = keymap.flax_to_hf(flax_path_str(path))
    a = np.array(transform.to_hf(np.asarray(value.get_value() if hasattr(value, "get_value") else value)),
                 order="C")  # a writable copy: torch does not take read-only arrays
    tensor = torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16) if a.dtype.name == "bfloat16" \
        else torch.from_numpy(a)
    weights[hf_key] = tensor.to(device=device, dtype=dtype)
  ref.load_state_dict(weights, strict=True)
  del weights
  to = lambda x, d=dtype: torch.from_numpy(np.asarray(x, np.float32)).to(device=device, dtype=d)
  ids = torch.from_numpy(np.asarray(cond.prior_ids_BxX)).to(device)
  batch = latents.shape[0]
  common = dict(hidden_states=to(latents), prior_token_id=ids, timestep=to(np.full((batch,), t)),
                target_size=to(size), crop_coords=to(crop), return_dict=False)
  g = pipeline.spec.guidance_scale

  def step():
    with torch.inference_mode():
      c = ref(encoder_hidden_states=to(cond.glyph_BxSxD), prior_token_drop=torch.zeros_like(ids, dtype=torch.bool),
              **common)[0].float()
      u = ref(encoder_hidden_states=to(cond.neg_glyph_BxSxD), prior_token_drop=torch.ones_like(ids, dtype=torch.bool),
              **common)[0].float()
      return u + g * (c - u)

  step = accel.synced(step, device)
  seconds, _ = timed(step, reps)
  want = step().cpu().numpy()
  return {"diffusers": dict(device=device, step_s=seconds,
                            max_abs_diff={k: float(np.max(np.abs(v - want))) for k, v in velocities.items()},
                            max_abs=float(np.max(np.abs(want))))}


def print_dit(out):
  print(f"\nDiT: {out['batch']} x {out['height']}x{out['width']}, CFG {out['guidance']}; VAE decode "
        f"{out['vae_s'] * 1e3:.1f} ms")
  ref = out.get("diffusers")
  rows = []
  for impl, r in out["kernels"].items():
    vs = f"{ref['step_s'] / r['step_s']:.2f}x" if isinstance(ref, dict) else "n/a"
    diff = f"{ref['max_abs_diff'][impl]:.2e} (of {ref['max_abs']:.2f})" if isinstance(ref, dict) else "n/a"
    mfu = f"{r['step_mfu_pct']:.0f}%" if "step_mfu_pct" in r else "n/a"
    rows.append([impl, f"{r['step_s'] * 1e3:.1f}", mfu, vs, diff, f"{r['decode_s']:.2f}",
                 f"{r['step_compile_s']:.1f} / {r['decode_compile_s']:.1f}"])
  if isinstance(ref, dict):
    rows.append([f"diffusers ({ref['device']})", f"{ref['step_s'] * 1e3:.1f}", "", "1.00x", "", "", ""])
  print(table(["kernel", "CFG step ms", "MFU", "diffusers / it", "max diff to diffusers",
               f"{out['steps']} steps + VAE s", "compile s (step / decode)"], rows))
  if not isinstance(ref, dict):
    print(f"diffusers: {ref}")


# ------------------------------------------------------------------------------------------------ train
STAGE_KEYS = ("time/sampling", "time/decode", "time/reward", "time/update", "time/step", "memory/peak_gib")


def train_flags(args, config, recipe: str) -> list[str]:
  """main.py flags of one recipe (`config`: its bench config) at `--prompts` x `--group` (micro-batches no larger
  than the batch)."""
  flags = [f"--config={os.path.join(ROOT, 'bench', 'fullsize_recipe.py')}:{recipe}{args.recipe_suffix}",
           f"--config.data.prompts_per_step={args.prompts}", f"--config.grpo.group_size={args.group}",
           f"--config.train.num_steps={args.train_steps}", f"--config.sampling.dit_steps={args.train_dit_steps}",
           "--config.log.image_interval=0", f"--config.checkpoint.save_interval={args.train_steps + 1}"]
  rows = args.prompts * args.group
  if config.train.micro_batch_size > rows:
    flags.append(f"--config.train.micro_batch_size={rows}")
  if "decoder" in config.train.policies:
    decoder_rows = rows * config.decoder.group_size
    if config.decoder.micro_batch_size > decoder_rows:
      flags.append(f"--config.decoder.micro_batch_size={decoder_rows}")
  return flags + args.train_flags.split()


def run_main(args, config, recipe: str, stage: str, *flags, env=None) -> tuple[str, float, str | None]:
  """`main.py` with one recipe's train-stage flags and `flags`, in a fresh `--out`/<stage>_<recipe>: (that workdir,
  wall seconds, None or the error that ended it, its output printed)."""
  workdir = os.path.join(args.out, f"{stage}_{recipe}")
  shutil.rmtree(workdir, ignore_errors=True)
  command = [sys.executable, os.path.join(ROOT, "main.py"), *train_flags(args, config, recipe), *flags,
             f"--workdir={workdir}"]
  print("$", " ".join(command), flush=True)
  t0 = time.perf_counter()
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
  wall = time.perf_counter() - t0
  if done.returncode:
    print(done.stdout[-4000:], done.stderr[-8000:], sep="\n")
    return workdir, wall, " ".join(["main.py", *flags[:1], f"exited {done.returncode}"])  # its mode, if any
  return workdir, wall, None


def train_stage(args) -> dict:
  out = {}
  for recipe in [r for r in args.recipes.split(",") if r]:
    config = run_config(args, recipe)
    workdir, wall, error = run_main(args, config, recipe, "train")
    if error:
      out[recipe] = dict(error=error, wall_s=wall)
      continue
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      steps = [json.loads(line) for line in f if line.strip()]
    steps = [s for s in steps if "time/step" in s]
    last = steps[-1]
    out[recipe] = dict(wall_s=wall, steps=len(steps), first_step_s=steps[0]["time/step"],
                       images=args.prompts * args.group * (
                           config.decoder.group_size if "decoder" in config.train.policies else 1),
                       **{k: last[k] for k in STAGE_KEYS if k in last})
  return out


def compile_stage(args, measured: dict) -> dict:
  """Each recipe's compile report at the train stage's flags for `--compile_topology`, on this host's CPU."""
  out = {}
  for recipe in [r for r in args.recipes.split(",") if r]:
    config = run_config(args, recipe)
    workdir, wall, error = run_main(args, config, recipe, "compile", "--mode=compile",
                                    f"--config.compile.topology={args.compile_topology}",
                                    env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if error:
      out[recipe] = dict(error=error)
      continue
    with open(os.path.join(workdir, "compile_report.json")) as f:
      report = json.load(f)
    row = dict(topology=args.compile_topology, compile_s=wall, fits=report["fits"],
               compiled_peak_gib=report["peak_bytes_per_chip"] / 2**30,
               budget_gib=report["memory_budget"]["budget_bytes"] / 2**30)
    peak = measured.get(recipe, {}).get("memory/peak_gib")
    if peak:
      row["measured_over_compiled"] = peak / row["compiled_peak_gib"]
    out[recipe] = row
  return out


def print_compile(out):
  print("\nCompile reports at the train stage's flags (peak per device, GiB):")
  rows = [[recipe, r["error"], "", "", "", ""] if "error" in r else
          [recipe, r["topology"], f"{r['compiled_peak_gib']:.2f}", f"{r['budget_gib']:.1f}", r["fits"],
           f"{r['measured_over_compiled']:.3f}" if "measured_over_compiled" in r else "n/a"] for recipe, r in out.items()]
  print(table(["recipe", "target", "compiled peak", "budget", "fits", "measured / compiled"], rows))


def print_train(out):
  print("\nTraining steps (the last step; the first includes compilation):")
  rows = []
  for recipe, r in out.items():
    if "error" in r:
      rows.append([recipe, r["error"]] + [""] * 7)
      continue
    rows.append([recipe, r["images"]] + [f"{r[k]:.2f}" if k in r else "n/a" for k in STAGE_KEYS] +
                [f"{r['first_step_s']:.1f}"])
  print(table(["recipe", "images", "sampling s", "decode s", "reward s", "update s", "step s", "peak GiB",
               "first step s"], rows))


def main(argv=None):
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  results = dict(size=args.size, argv=sys.argv[1:] if argv is None else argv)
  if "train" in args.stages:  # first: the child must find the device free
    results["train"] = train_stage(args)
    print_train(results["train"])
  if "compile" in args.stages:  # a CPU child: the device stays free
    results["compile"] = compile_stage(args, results.get("train", {}))
    print_compile(results["compile"])
  hbm, flops = None, None
  if {"ar", "dit"} & set(args.stages):
    hbm, flops = chip_rates(args.hbm_gbps)
    results["device"] = dict(kind=jax.devices()[0].device_kind, backend=jax.default_backend(), jax=jax.__version__,
                             hbm_bytes_per_s=hbm, bf16_flops=flops)
    print(f"device: {results['device']}")
  if "ar" in args.stages:
    results["ar"] = ar_stage(args, hbm)
    print_ar(results["ar"])
    jax.clear_caches()
  if "dit" in args.stages:
    results["dit"] = dit_stage(args, flops)
    print_dit(results["dit"])
  with open(os.path.join(args.out, "fullsize.json"), "w") as f:
    json.dump(results, f, indent=1, default=str)
  print(f"\nwritten: {os.path.join(args.out, 'fullsize.json')}")
  failed = [r for stage in ("train", "compile") for r, v in results.get(stage, {}).items() if "error" in v]
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
