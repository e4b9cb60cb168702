"""The LAION "improved aesthetic predictor" head (christophschuhmann/improved-aesthetic-predictor).

An MLP 768 -> 1024 -> 128 -> 64 -> 16 -> 1 on the unit-norm CLIP ViT-L/14 image embedding. The
published model's ReLUs are commented out, so the layers compose linearly (its Dropouts are
identities at inference). Its weights file `sac+logos+ava1-l14-linearMSE.pth` is a torch state_dict
`layers.{0,2,4,6,7}.{weight,bias}`; convert it once with

    python -m glmrl.models.clip.aesthetic --pth sac+logos+ava1-l14-linearMSE.pth --out_dir aesthetic

which writes `out_dir/config.json` and `out_dir/params/` (Orbax). Widths are read from the file, so
the converter also handles the tiny test layout. The file is 3.7 MB and is held in memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.sharding import EMBED, MLP

CONFIG_NAME = "config.json"
MODEL_TYPE = "laion_aesthetic_mlp"


@dataclasses.dataclass(frozen=True)
class AestheticConfig:
  """Widths of the MLP: `embed_dim` in, `hidden` layers, then 1 out."""
  embed_dim: int = 768
  hidden: tuple[int, ...] = (1024, 128, 64, 16)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    object.__setattr__(self, "hidden", tuple(self.hidden))
    for w in (self.embed_dim, *self.hidden):
      if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        raise ValueError(f"AestheticConfig widths must be positive ints, got embed_dim={self.embed_dim}, "
                         f"hidden={self.hidden}")
    if len(self.hidden) != 4:
      raise ValueError(f"AestheticConfig.hidden={self.hidden}: the published MLP has 4 hidden layers")

  @classmethod
  def from_hf(cls, d: dict) -> "AestheticConfig":
    """From the config.json the converter writes."""
    if d.get("model_type") != MODEL_TYPE:
      raise ValueError(f"model_type={d.get('model_type')!r}, expected {MODEL_TYPE!r}")
    unknown = sorted(set(d) - {"model_type", "embed_dim", "hidden"})
    if unknown:
      raise ValueError(f"aesthetic config: unknown key(s) {unknown}")
    return cls(embed_dim=d.get("embed_dim", 768), hidden=tuple(d.get("hidden", (1024, 128, 64, 16))))

  def to_hf(self) -> dict:
    return {"model_type": MODEL_TYPE, "embed_dim": self.embed_dim, "hidden": list(self.hidden)}

  @property
  def widths(self) -> tuple[int, ...]:
    return (self.embed_dim, *self.hidden, 1)

  @classmethod
  def full(cls, **overrides) -> "AestheticConfig":
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides) -> "AestheticConfig":
    return cls(**{"embed_dim": 16, "hidden": (24, 12, 8, 4), **overrides})


class AestheticHead(nnx.Module):
  """Unit-norm image embeddings [B, embed_dim] -> aesthetic scores [B] (float32)."""

  def __init__(self, cfg: AestheticConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    w = cfg.widths
    names = [(EMBED, MLP)] + [(MLP, MLP)] * (len(w) - 3) + [(MLP, None)]
    self.layers = nnx.List([
        nnx.Linear(w[i], w[i + 1], dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                   kernel_metadata={"out_sharding": names[i]}, bias_metadata={"out_sharding": (names[i][1],)})
        for i in range(len(w) - 1)])

  def __call__(self, embeds_BxE: jax.Array) -> jax.Array:
    if embeds_BxE.ndim != 2 or embeds_BxE.shape[1] != self.cfg.embed_dim:
      raise ValueError(f"embeddings must be [B, {self.cfg.embed_dim}], got shape {tuple(embeds_BxE.shape)}")
    x = embeds_BxE
    for layer in self.layers:
      x = layer(x)
    return x[:, 0].astype(jnp.float32)



def config_from_state(state: dict[str, np.ndarray], where: str) -> AestheticConfig:
  """Widths read from the published layout's Linear weights ([out, in])."""
  from checkpoints_convert.maps.clip import AESTHETIC_TORCH_LINEARS

  keys = [f"layers.{i}.weight" for i in AESTHETIC_TORCH_LINEARS]
  missing = [k for k in keys if k not in state]
  if missing:
    raise ValueError(f"{where}: not the aesthetic predictor's state_dict, missing {missing}; has {sorted(state)}")
  bad = [f"{k} {list(state[k].shape)}" for k in keys if state[k].ndim != 2]
  if bad or state[keys[-1]].shape[0] != 1:
    raise ValueError(f"{where}: expected 2-D Linear weights ending in one output, got "
                     f"{[list(state[k].shape) for k in keys]}")
  return AestheticConfig(embed_dim=int(state[keys[0]].shape[1]),
                         hidden=tuple(int(state[k].shape[0]) for k in keys[:-1]))


def plan(state: dict[str, np.ndarray], cfg: AestheticConfig, where: str) -> dict[str, np.ndarray]:
  """{flax path: array} for every head parameter; one ValueError lists every problem."""
  from checkpoints_convert import hf_to_flax
  from checkpoints_convert.maps.clip import AESTHETIC_RULES
  from checkpoints_convert.rules import KeyMap

  key_map = KeyMap(AESTHETIC_RULES)
  expected = hf_to_flax.flatten(nnx.state(nnx.eval_shape(lambda: AestheticHead(cfg, rngs=nnx.Rngs(0))), nnx.Param))
  out, unexpected, mismatched = {}, [], []
  for key, value in state.items():
    match = key_map.hf_to_flax(key)
    if match is None or match[0] not in expected:
      unexpected.append(key)
      continue
    path, transform = match
    got, want = transform.flax_shape(value.shape), tuple(expected[path].shape)
    if got != want:
      mismatched.append(f"{key} {list(value.shape)} -> {path} gives {got}, model expects {want}")
      continue
    out[path] = transform.to_flax(value)
  missing = [f"{key_map.flax_to_hf(p)[0]} (for {p})" for p in expected if p not in out]
  hf_to_flax.check_coverage(where, missing, unexpected, mismatched)
  return out


def convert_head(pth_path: str, out_dir: str) -> dict:
  """Writes `out_dir`/{config.json, params/} from the published weights file; returns a summary."""
  from checkpoints_convert import hf_to_flax

  from checkpoints_convert.torch_files import read_state_dict

  state = read_state_dict(pth_path)
  cfg = config_from_state(state, pth_path)
  flat = plan(state, cfg, pth_path)
  params_dir = os.path.join(out_dir, "params")
  if os.path.exists(params_dir):
    raise ValueError(f"{params_dir} already exists; remove it or choose another out_dir")
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, CONFIG_NAME), "w") as f:
    json.dump(cfg.to_hf(), f, indent=2)
  hf_to_flax.save_params(params_dir, flat)
  return {"tensors": len(flat), "bytes": sum(a.nbytes for a in flat.values()), "config": cfg.to_hf()}


def load_head(head_dir: str, **config_overrides) -> AestheticHead:
  """The head stored by `convert_head` in `head_dir`."""
  from checkpoints_convert import hf_to_flax

  path = os.path.join(head_dir, CONFIG_NAME)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"aesthetic head_dir {head_dir!r} has no {CONFIG_NAME} (convert the published "
                            "weights with `python -m glmrl.models.clip.aesthetic`)")
  with open(path) as f:
    cfg = AestheticConfig.from_hf(json.load(f))
  if config_overrides:
    cfg = dataclasses.replace(cfg, **config_overrides)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: AestheticHead(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  return nnx.merge(graphdef, hf_to_flax.load_params(head_dir, abstract))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m glmrl.models.clip.aesthetic", description=__doc__.splitlines()[0])
  p.add_argument("--pth", required=True, help="sac+logos+ava1-l14-linearMSE.pth (torch state_dict)")
  p.add_argument("--out_dir", required=True, help="folder to write config.json and params/ into")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    done = convert_head(args.pth, args.out_dir)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"converted the aesthetic head: {done['tensors']} tensors, {done['bytes'] / 1e6:.2f} MB -> {args.out_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
