"""The LAION aesthetic predictor's published weights -> a folder `glmrl.models.clip.aesthetic.load_head` reads.

    python -m checkpoints_convert.aesthetic --pth sac+logos+ava1-l14-linearMSE.pth --out_dir aesthetic

writes `out_dir/config.json` and `out_dir/params/` (Orbax). Widths are read from the file, so the
converter also handles the tiny test layout. The file is 3.7 MB and is held in memory.
"""

from __future__ import annotations

import sys

import numpy as np
from flax import nnx

from checkpoints_convert import hf_to_flax
from checkpoints_convert.maps.clip import AESTHETIC_RULES, AESTHETIC_TORCH_LINEARS
from checkpoints_convert.rules import KeyMap
from checkpoints_convert.torch_files import read_state_dict
from glmrl.checkpoint.params import flatten
from glmrl import errors
from glmrl.errors import UserError, run_command
from glmrl.models.clip.aesthetic import AestheticConfig, AestheticHead
from glmrl.models.init_rngs import InitRngs

def config_from_state(state: dict[str, np.ndarray], where: str) -> AestheticConfig:
  """Widths read from the published layout's Linear weights ([out, in])."""
  keys = [f"layers.{i}.weight" for i in AESTHETIC_TORCH_LINEARS]
  missing = [k for k in keys if k not in state]
  if missing:
    raise UserError(f"{where}: not the aesthetic predictor's state_dict, missing {missing}; has {sorted(state)}")
  bad = [f"{k} {list(state[k].shape)}" for k in keys if state[k].ndim != 2]
  if bad or state[keys[-1]].shape[0] != 1:
    raise UserError(f"{where}: expected 2-D Linear weights ending in one output, got "
                    f"{[list(state[k].shape) for k in keys]}")
  return AestheticConfig(embed_dim=int(state[keys[0]].shape[1]),
                         hidden=tuple(int(state[k].shape[0]) for k in keys[:-1]))


def plan(state: dict[str, np.ndarray], cfg: AestheticConfig, where: str) -> dict[str, np.ndarray]:
  """{flax path: array} for every head parameter; one ValueError lists every problem."""
  expected = flatten(nnx.state(nnx.eval_shape(lambda: AestheticHead(cfg, rngs=InitRngs(0))), nnx.Param))
  return hf_to_flax.plan_state_dict(state, KeyMap(AESTHETIC_RULES), expected, where)


def convert_aesthetic_head(pth_path: str, out_dir: str) -> dict:
  """Writes `out_dir`/{config.json, params/} from the published weights file; returns a summary."""
  state = read_state_dict(pth_path)
  cfg = config_from_state(state, pth_path)
  return hf_to_flax.write_model_folder(out_dir, cfg.to_hf(), plan(state, cfg, pth_path))


def main(argv=None) -> int:
  p = errors.ArgumentParser(prog="python -m checkpoints_convert.aesthetic", description=__doc__.splitlines()[0])
  p.add_argument("--pth", required=True, help="sac+logos+ava1-l14-linearMSE.pth (torch state_dict)")
  p.add_argument("--out_dir", required=True, help="folder to write config.json and params/ into")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)

  def convert():
    done = convert_aesthetic_head(args.pth, args.out_dir)
    return f"converted the aesthetic head: {done['tensors']} tensors, {done['bytes'] / 1e6:.2f} MB -> {args.out_dir}"

  return run_command(convert)


if __name__ == "__main__":
  sys.exit(main())
