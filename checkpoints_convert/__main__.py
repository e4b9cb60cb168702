"""Command line: HF folder -> Flax/Orbax (default) or back with --to_hf."""

from __future__ import annotations

import sys

from checkpoints_convert import flax_to_hf
from checkpoints_convert import hf_to_flax
from glmrl import errors
from glmrl.errors import run_command


def parse_args(argv):
  p = errors.ArgumentParser(prog="python -m checkpoints_convert", description=__doc__)
  p.add_argument("--hf_dir", help="GLM-Image HF folder to convert (one sub-folder per component)")
  p.add_argument("--out_dir", help="where the Flax/Orbax checkpoint is written")
  p.add_argument("--to_hf", action="store_true", help="export an Orbax checkpoint to HF safetensors")
  p.add_argument("--ckpt_dir", help="converted checkpoint, or a training run's checkpoints/ folder")
  p.add_argument("--hf_out_dir", help="where the HF folder is written (--to_hf)")
  p.add_argument("--step", type=int, default=None, help="training step to export (default: latest)")
  p.add_argument("--source_dir", default=None,
                 help="converted folder the other pipeline components are taken from when exporting a training "
                      "run (default: the run's config.model.checkpoint_dir, recorded in checkpoints/source.json); "
                      "'' writes the trained generator alone")
  p.add_argument("--merge_lora", action="store_true",
                 help="a LoRA run: write the base models with their adapters merged in, instead of the bases and "
                      "the adapters (PEFT's format for the generator, diffusers' for the DiT) (--to_hf)")
  p.add_argument("--use_ema", action="store_true",
                 help="a run whose decoder kept a moving average (config.decoder.ema): export the average of its "
                      "trained parameters instead of the parameters (--to_hf)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace a non-empty --hf_out_dir (once the new folder is complete) instead of refusing it")
  p.add_argument("--max_shard_size", default=flax_to_hf.DEFAULT_MAX_SHARD_SIZE,
                 help="shard safetensors above this size, e.g. 5GB or 500MiB (--to_hf)")
  args = p.parse_args(argv)
  if args.to_hf:
    wrong = [f"--{n}" for n in ("hf_dir", "out_dir") if getattr(args, n)]
    if not args.ckpt_dir or not args.hf_out_dir or wrong:
      p.error("--to_hf takes --ckpt_dir and --hf_out_dir" + (f", not {' '.join(wrong)}" if wrong else ""))
  else:
    wrong = [f"--{n}" for n in ("ckpt_dir", "hf_out_dir", "step", "source_dir") if getattr(args, n) is not None]
    wrong += [f"--{n}" for n in ("merge_lora", "use_ema", "overwrite") if getattr(args, n)]
    if not args.hf_dir or not args.out_dir or wrong:
      p.error("conversion takes --hf_dir and --out_dir" + (f", not {' '.join(wrong)} (use --to_hf)" if wrong else ""))
  return args


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.to_hf:
    return run_command(lambda: flax_to_hf.export(args.ckpt_dir, args.hf_out_dir, step=args.step,
                                             source_dir=args.source_dir, max_shard_size=args.max_shard_size,
                                             merge_lora=args.merge_lora, use_ema=args.use_ema,
                                             overwrite=args.overwrite))
  return run_command(lambda: hf_to_flax.convert_pipeline(args.hf_dir, args.out_dir))


if __name__ == "__main__":
  sys.exit(main())
