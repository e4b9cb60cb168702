"""LPIPS-VGG16 weights: the two published files -> one Orbax folder `glmrl.models.lpips.load_lpips` reads.

    python -m checkpoints_convert.lpips --vgg16=vgg16-397923af.pth \
        --lpips=<site-packages>/lpips/weights/v0.1/vgg.pth --out_dir=lpips_vgg

`--vgg16`: torchvision's ImageNet `vgg16` state_dict; `--lpips`: the `lpips` package's v0.1 VGG
heads. Each may be a torch pickle (`.pth`/`.pt`/`.bin`, read with `torch.load(weights_only=True)`,
so torch must be installed for those) or a `.safetensors` file. The widths are read from the VGG
file, so the same converter handles the released sizes and the tiny test layouts. Writes
`out_dir/config.json` and `out_dir/params/` (Orbax). Everything is checked (every key used, every
parameter produced, shapes) before anything is written. The whole model is ~59 MB, so tensors are
held in memory; a legacy-format torchvision file is read whole (~0.5 GB, classifier included).
"""

from __future__ import annotations

import sys

import numpy as np
from flax import nnx

from checkpoints_convert import hf_to_flax
from checkpoints_convert.torch_files import read_state_dict
from checkpoints_convert.maps import lpips as lpips_map
from checkpoints_convert.rules import KeyMap
from glmrl.checkpoint.params import flatten
from glmrl import errors
from glmrl.errors import UserError, run_command
from glmrl.models.vgg import CONVS_PER_BLOCK, VGG16Config, torchvision_conv_indices
from glmrl.models.lpips import LPIPS, LPIPSConfig
from glmrl.models.init_rngs import InitRngs


def config_from_vgg(state: dict[str, np.ndarray], where: str) -> LPIPSConfig:
  """The widths of VGG16's five blocks, read from the last convolution of each."""
  indices = torchvision_conv_indices()
  last = np.cumsum(CONVS_PER_BLOCK) - 1
  keys = [f"features.{indices[i]}.weight" for i in last]
  missing = [k for k in keys + ["features.0.weight"] if k not in state]
  if missing:
    raise UserError(f"{where}: not a torchvision vgg16 state_dict, missing {missing}")
  for k in keys + ["features.0.weight"]:
    if state[k].ndim != 4:
      raise UserError(f"{where}: {k} has shape {list(state[k].shape)}, expected a 4-D conv weight")
  vgg = VGG16Config(block_channels=tuple(int(state[k].shape[0]) for k in keys),
                    in_channels=int(state["features.0.weight"].shape[1]))
  return LPIPSConfig(vgg=vgg)


def plan(state: dict[str, np.ndarray], cfg: LPIPSConfig, where: str) -> dict[str, np.ndarray]:
  """{flax path: array} for every LPIPS parameter; one ValueError lists every problem."""
  expected = flatten(nnx.state(nnx.eval_shape(lambda: LPIPS(cfg, rngs=InitRngs(0))), nnx.Param))
  return hf_to_flax.plan_state_dict(state, KeyMap(lpips_map.RULES), expected, where)


def convert_lpips(vgg16_path: str, lpips_path: str, out_dir: str) -> dict:
  """Writes `out_dir`/{config.json, params/}; returns {'tensors', 'bytes', 'config'}."""
  vgg = read_state_dict(vgg16_path, keep=lambda k: not k.startswith(lpips_map.IGNORED_PREFIXES))
  heads = read_state_dict(lpips_path)
  both = set(vgg) & set(heads)
  if both:
    raise UserError(f"{vgg16_path} and {lpips_path} both hold {sorted(both)}")
  cfg = config_from_vgg(vgg, vgg16_path)
  flat = plan({**vgg, **heads}, cfg, f"LPIPS from {vgg16_path} + {lpips_path}")
  return hf_to_flax.write_model_folder(out_dir, cfg.to_hf(), flat)


def main(argv=None) -> int:
  p = errors.ArgumentParser(prog="python -m checkpoints_convert.lpips", description=__doc__.splitlines()[0])
  p.add_argument("--vgg16", required=True, help="torchvision vgg16 state_dict (.pth or .safetensors)")
  p.add_argument("--lpips", required=True, help="lpips package weights/v0.1/vgg.pth (or .safetensors)")
  p.add_argument("--out_dir", required=True, help="folder to write config.json and params/ into")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)

  def convert():
    done = convert_lpips(args.vgg16, args.lpips, args.out_dir)
    return f"converted LPIPS-VGG16: {done['tensors']} tensors, {done['bytes'] / 1e6:.1f} MB -> {args.out_dir}"

  return run_command(convert)


if __name__ == "__main__":
  sys.exit(main())
