"""ImageReward's released weights -> a folder the `image_reward` reward loads.

    python -m checkpoints_convert.image_reward --checkpoint ImageReward.pt --out_dir image_reward \
        [--med_config med_config.json]

`ImageReward.pt` (THUDM/ImageReward on the Hugging Face Hub) is a torch state_dict of ImageReward's own modules:
BLIP's ViT (`blip.visual_encoder`), BLIP's text encoder (`blip.text_encoder`) and the MLP head (`mlp.layers`).
Sizes are read from the tensors; attention heads are not in them: the ViT's are its width / 64 (BLIP's ViT-B and
ViT-L), the text encoder's come from `--med_config` (the repository's `med_config.json`, as `ImageReward.load`
reads it; without it width / 64, bert-base's 12). Writes `out_dir/config.json` and `out_dir/params/` (Orbax). The
file (1.8 GB) is read into memory as float32.
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
from flax import nnx

from checkpoints_convert import hf_to_flax
from checkpoints_convert.maps.image_reward import RULES, TEXT, UNUSED, VISION
from checkpoints_convert.rules import KeyMap
from checkpoints_convert.torch_files import read_state_dict
from glmrl import errors
from glmrl.checkpoint.params import flatten
from glmrl.errors import UserError, run_command
from glmrl.models.blip.config import BlipTextConfig, BlipVisionConfig, ImageRewardConfig
from glmrl.models.blip.model import ImageRewardModel
from glmrl.models.init_rngs import InitRngs

HEAD_DIM = 64  # BLIP's ViTs and bert-base: the width per attention head
HEAD_LINEARS = (0, 2, 4, 6, 7)


def _require(state: dict, keys, where: str) -> None:
  missing = [k for k in keys if k not in state]
  if missing:
    raise UserError(f"{where}: not ImageReward's state_dict, missing {missing[:4]}"
                    f"{' ...' if len(missing) > 4 else ''} (keys: {sorted(state)[:6]} ...)")


def _count(state: dict, pattern: str) -> int:
  found = {int(m.group(1)) for k in state for m in [re.fullmatch(pattern, k)] if m}
  return max(found) + 1 if found else 0


def config_from_state(state: dict[str, np.ndarray], med_config: dict | None, where: str) -> ImageRewardConfig:
  """Sizes from the tensors' shapes, text heads and LayerNorm eps from BLIP's med_config (when given)."""
  _require(state, (f"{VISION}.cls_token", f"{VISION}.pos_embed", f"{VISION}.patch_embed.proj.weight",
                   f"{TEXT}.embeddings.word_embeddings.weight", f"{TEXT}.embeddings.position_embeddings.weight",
                   f"{TEXT}.encoder.layer.0.intermediate.dense.weight",
                   *(f"mlp.layers.{i}.weight" for i in HEAD_LINEARS)), where)
  width = int(state[f"{VISION}.cls_token"].shape[-1])
  patch = int(state[f"{VISION}.patch_embed.proj.weight"].shape[-1])
  grid = int(round((state[f"{VISION}.pos_embed"].shape[-2] - 1) ** 0.5))
  vision = BlipVisionConfig(hidden_size=width, num_hidden_layers=_count(state, rf"{VISION}\.blocks\.(\d+)\..*"),
                            num_attention_heads=max(1, width // HEAD_DIM), image_size=grid * patch,
                            patch_size=patch)
  vocab, text_width = state[f"{TEXT}.embeddings.word_embeddings.weight"].shape
  med = med_config or {}
  text = BlipTextConfig(
      vocab_size=int(vocab), hidden_size=int(text_width),
      intermediate_size=int(state[f"{TEXT}.encoder.layer.0.intermediate.dense.weight"].shape[0]),
      num_hidden_layers=_count(state, rf"{TEXT}\.encoder\.layer\.(\d+)\..*"),
      num_attention_heads=int(med.get("num_attention_heads", max(1, text_width // HEAD_DIM))),
      max_position_embeddings=int(state[f"{TEXT}.embeddings.position_embeddings.weight"].shape[0]),
      layer_norm_eps=float(med.get("layer_norm_eps", 1e-12)), encoder_width=width)
  hidden = tuple(int(state[f"mlp.layers.{i}.weight"].shape[0]) for i in HEAD_LINEARS[:-1])
  return ImageRewardConfig(vision=vision, text=text, head_hidden=hidden)


def prepare_state(state: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
  """The state_dict under the key map's names: the ViT's fused qkv split into q, k, v (rows in that order, as
  BLIP's Attention reshapes them), the unit axes of the class token and positions dropped, unused keys left out."""
  out = {}
  for key, value in state.items():
    if key in UNUSED:
      continue
    m = re.fullmatch(rf"({re.escape(VISION)}\.blocks\.\d+\.attn)\.qkv\.(weight|bias)", key)
    if m:
      if value.shape[0] % 3:
        raise UserError(f"{where}: {key} has {value.shape[0]} rows, not 3 equal q, k, v parts")
      for name, part in zip("qkv", np.split(value, 3, axis=0)):
        out[f"{m.group(1)}.{name}.{m.group(2)}"] = part
    elif key in (f"{VISION}.cls_token", f"{VISION}.pos_embed"):
      if value.ndim != 3 or value.shape[0] != 1 or (key.endswith("cls_token") and value.shape[1] != 1):
        raise UserError(f"{where}: {key} has shape {list(value.shape)}, expected [1, {'1' if key.endswith('cls_token') else 'N + 1'}, D]")
      out[key] = value.reshape(value.shape[-1]) if key.endswith("cls_token") else value[0]
    else:
      out[key] = value
  return out


def _read_med_config(path: str | None) -> dict | None:
  if not path:
    return None
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--med_config {path!r} is not a file (ImageReward's med_config.json)")
  with open(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise UserError(f"--med_config {path}: not valid JSON ({e})") from None


def convert_image_reward(checkpoint: str, out_dir: str, med_config: str | None = None) -> dict:
  """Writes `out_dir`/{config.json, params/}; returns a summary (tensors, bytes, config)."""
  med = _read_med_config(med_config)
  state = read_state_dict(checkpoint)
  if state and all(k.startswith("module.") for k in state):
    raise UserError(f"{checkpoint}: every key starts with 'module.' (a DataParallel wrapper's state_dict); "
                    "save the unwrapped model's")
  cfg = config_from_state(state, med, checkpoint)
  expected = flatten(nnx.state(nnx.eval_shape(lambda: ImageRewardModel(cfg, rngs=InitRngs(0))), nnx.Param))
  flat = hf_to_flax.plan_state_dict(prepare_state(state, checkpoint), KeyMap(RULES), expected, checkpoint)
  return hf_to_flax.write_model_folder(out_dir, cfg.to_hf(), flat)


def main(argv=None) -> int:
  p = errors.ArgumentParser(prog="python -m checkpoints_convert.image_reward", description=__doc__.splitlines()[0])
  p.add_argument("--checkpoint", required=True, help="ImageReward.pt (torch state_dict)")
  p.add_argument("--out_dir", required=True, help="folder to write config.json and params/ into")
  p.add_argument("--med_config", default=None, help="ImageReward's med_config.json (the text encoder's heads)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)

  def convert():
    done = convert_image_reward(args.checkpoint, args.out_dir, args.med_config)
    return f"converted ImageReward: {done['tensors']} tensors, {done['bytes'] / 1e9:.3f} GB -> {args.out_dir}"

  return run_command(convert)


if __name__ == "__main__":
  sys.exit(main())
