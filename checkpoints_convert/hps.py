"""HPS v2.1 (an OpenCLIP checkpoint) -> converted CLIP folder, through `checkpoints_convert`.

    python -m checkpoints_convert.hps --checkpoint HPS_v2.1_compressed.pt --out_dir hps_v2.1

HPS v2.1 (Wu et al. 2023, `xswu/HPSv2` on the Hugging Face Hub) is OpenCLIP's ViT-H/14 fine-tuned on human
preference pairs, released as a torch file holding `{"state_dict": ...}` in OpenCLIP's key layout. Its towers are
transformers' `CLIPModel` under other names: no layer scale, class-token pooling, no attention pooling, the text
pooled at its end-of-text token (the largest id: argmax pooling), exact GELU. Two layouts differ: OpenCLIP fuses
each attention's query, key and value into one `in_proj` (split here) and multiplies by its projections from the
right (`x @ proj`, transposed here into `Linear` weights). The tensors are renamed into a temporary
`CLIPModel` safetensors file inside `out_dir` (one at a time; deleted afterwards), then converted by the `clip`
component as `python -m checkpoints_convert.clip` converts any CLIP folder.

The attention heads are not in the weights: `--model_config` is OpenCLIP's model config (its
`model_configs/<name>.json`, the layout `embed_dim`, `vision_cfg`, `text_cfg`), by default ViT-H-14's.
The tokenizer is laion/CLIP-ViT-H-14-laion2B-s32B-b79K's (pass that folder as the reward's `tokenizer_dir`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from typing import Callable

import numpy as np

from checkpoints_convert import components, hf_to_flax, torch_files
from checkpoints_convert import safetensors_stream as st
from checkpoints_convert.clip import COMPONENT
from glmrl import errors
from glmrl.checkpoint.params import PARAMS_DIR
from glmrl.errors import UserError, run_command
from glmrl.models.clip.config import ClipConfig, ClipTextConfig, ClipVisionConfig

# open_clip's model_configs/ViT-H-14.json.
VIT_H_14 = {"embed_dim": 1024,
            "vision_cfg": {"image_size": 224, "layers": 32, "width": 1280, "head_width": 80, "patch_size": 14},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 1024, "heads": 16, "layers": 24}}
# open_clip's defaults for what a model config leaves out (open_clip/model.py CLIPVisionCfg / CLIPTextCfg).
VISION_DEFAULTS = {"head_width": 64, "mlp_ratio": 4.0}
TEXT_DEFAULTS = {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "mlp_ratio": 4.0}
# Settings of open_clip's towers this conversion has no counterpart for (in transformers' CLIPModel or here).
UNSUPPORTED = {
    "vision_cfg": {"ls_init_value": None, "attentional_pool": False, "global_average_pool": False,
                   "no_ln_pre": False, "final_ln_after_pool": False, "pool_type": "tok", "timm_model_name": None,
                   "act_kwargs": None, "norm_kwargs": None},
    "text_cfg": {"ls_init_value": None, "hf_model_name": None, "embed_cls": False, "no_causal_mask": False,
                 "pool_type": "argmax", "proj_bias": False, "act_kwargs": None, "norm_kwargs": None},
}
# End-of-text is the largest id of CLIP's vocabulary: transformers' legacy eos_token_id=2 pools at the argmax.
ARGMAX_POOLING_EOS = 2
# A non-parameter buffer some OpenCLIP versions saved (the text tower's causal mask).
BUFFERS = ("attn_mask",)


def clip_config(model_config: dict) -> ClipConfig:
  """The `ClipConfig` of an OpenCLIP model config dict (exact GELU unless `quick_gelu`)."""
  if not isinstance(model_config, dict) or not {"embed_dim", "vision_cfg", "text_cfg"} <= set(model_config):
    raise UserError(f"an OpenCLIP model config needs embed_dim, vision_cfg and text_cfg, got {model_config!r}")
  vision = {**VISION_DEFAULTS, **model_config["vision_cfg"]}
  text = {**TEXT_DEFAULTS, **model_config["text_cfg"]}
  for name, cfg in (("vision_cfg", vision), ("text_cfg", text)):
    for key, supported in UNSUPPORTED[name].items():
      if cfg.get(key, supported) != supported:
        raise UserError(f"OpenCLIP {name}.{key}={cfg[key]!r} is not supported (only {supported!r})")
  if isinstance(vision.get("layers"), (list, tuple)):
    raise UserError(f"OpenCLIP vision_cfg.layers={vision['layers']!r}: a ResNet tower is not supported")
  act = "quick_gelu" if model_config.get("quick_gelu", False) else "gelu"
  width = vision["width"]
  return ClipConfig(
      text=ClipTextConfig(vocab_size=text["vocab_size"], hidden_size=text["width"],
                          intermediate_size=int(text["width"] * text["mlp_ratio"]), num_hidden_layers=text["layers"],
                          num_attention_heads=text["heads"], max_position_embeddings=text["context_length"],
                          hidden_act=act, eos_token_id=ARGMAX_POOLING_EOS),
      vision=ClipVisionConfig(hidden_size=width, intermediate_size=int(width * vision["mlp_ratio"]),
                              num_hidden_layers=vision["layers"], num_attention_heads=width // vision["head_width"],
                              image_size=vision["image_size"], patch_size=vision["patch_size"], hidden_act=act),
      projection_dim=model_config["embed_dim"])


# OpenCLIP name -> CLIPModel name, for everything but the fused attention input and the two projections.
_BLOCK = [("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"), ("attn.out_proj", "self_attn.out_proj"),
          ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")]
_RENAMES = {
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
}
_PROJECTIONS = {"text_projection": "text_projection.weight", "visual.proj": "visual_projection.weight"}
_LAYER = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.(.+)\.(weight|bias)$")
_IN_PROJ = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.attn\.in_proj_(weight|bias)$")


def hf_tensors(key: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], Callable]]:
  """The CLIPModel tensors an OpenCLIP tensor becomes: [(name, shape, from_openclip(array) -> array)]."""
  if key in _RENAMES:
    return [(_RENAMES[key], shape, lambda a: a)]
  if key in _PROJECTIONS:
    if len(shape) != 2:
      raise UserError(f"OpenCLIP {key} has shape {list(shape)}, expected [width, embed_dim]")
    return [(_PROJECTIONS[key], shape[::-1], lambda a: np.ascontiguousarray(a.T))]
  match = _LAYER.match(key)
  if match is None:
    raise UserError(f"OpenCLIP key {key!r} has no CLIPModel counterpart")
  visual, layer, name, kind = match.groups()
  prefix = f"{'vision' if visual else 'text'}_model.encoder.layers.{layer}."
  for theirs, ours in _BLOCK:
    if name == theirs:
      return [(f"{prefix}{ours}.{kind}", shape, lambda a: a)]
  raise UserError(f"OpenCLIP key {key!r} has no CLIPModel counterpart")


def _in_proj(key: str, shape: tuple[int, ...]):
  """The query, key and value tensors of one fused attention input projection (rows [q; k; v])."""
  visual, layer, kind = _IN_PROJ.match(key).groups()
  if shape[0] % 3:
    raise UserError(f"OpenCLIP {key} has shape {list(shape)}: its first dimension is not 3 x width")
  width = shape[0] // 3
  prefix = f"{'vision' if visual else 'text'}_model.encoder.layers.{layer}.self_attn."
  rows = lambda i: lambda a: np.ascontiguousarray(a[i * width:(i + 1) * width])
  return [(f"{prefix}{p}_proj.{kind}", (width, *shape[1:]), rows(i)) for i, p in enumerate("qkv")]


def openclip_to_clipmodel(state: dict) -> dict[str, tuple[tuple[int, ...], object, Callable]]:
  """{CLIPModel name: (shape, dtype, read())} of an OpenCLIP state dict (`torch_pickle.TorchTensor`s, read one at a time)."""
  out = {}
  for key, tensor in state.items():
    if key in BUFFERS:
      continue
    shape = tuple(tensor.shape)
    parts = _in_proj(key, shape) if _IN_PROJ.match(key) else hf_tensors(key, shape)
    for name, hf_shape, transform in parts:
      out[name] = (hf_shape, tensor.dtype, lambda t=tensor, f=transform: f(t.numpy()))
  return out


def check_fits(tensors: dict, cfg: ClipConfig, where: str) -> None:
  """One line naming what `tensors` (CLIPModel names, `openclip_to_clipmodel`) lack, have in excess or shape
  otherwise than the CLIP of `cfg` takes; before anything is written."""
  component = components.get(COMPONENT)
  key_map = component.key_map()
  want = {}
  for path, abstract in hf_to_flax.expected_params(component, cfg).items():
    hf_key, transform = key_map.flax_to_hf(path)
    want[hf_key] = tuple(transform.hf_shape(abstract.shape))
  problems = []
  missing, unexpected = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
  if missing:
    problems.append(f"missing {len(missing)} ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})")
  if unexpected:
    problems.append(f"unexpected {len(unexpected)} ({', '.join(unexpected[:4])}{', ...' if len(unexpected) > 4 else ''})")
  wrong = [f"{k} {list(tensors[k][0])}, model expects {list(want[k])}" for k in sorted(want)
           if k in tensors and tuple(tensors[k][0]) != want[k]]
  if wrong:
    problems.append(f"{len(wrong)} shapes differ ({'; '.join(wrong[:3])}{'; ...' if len(wrong) > 3 else ''})")
  if problems:
    raise UserError(f"{where} does not fit the OpenCLIP model config (--model_config): CLIPModel tensors "
                    + "; ".join(problems))


def read_state_dict(path: str) -> dict:
  """The OpenCLIP state dict of a torch file (HPS' `{"state_dict": ...}` or a bare state dict), read tensor by tensor."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--checkpoint {path} is not a file (HPS v2.1 is HPS_v2.1_compressed.pt)")
  state = torch_files.load_torch(path)
  if isinstance(state.get("state_dict"), dict):
    state = state["state_dict"]
  if not all(hasattr(v, "shape") for v in state.values()):
    raise UserError(f"{path}: holds neither an OpenCLIP state_dict nor {{'state_dict': ...}}")
  if any(k.startswith("module.") for k in state):
    raise UserError(f"{path}: keys start with 'module.' (a wrapped model's); save model.state_dict() itself")
  return state


def convert_hps(checkpoint: str, out_dir: str, model_config: str = "", log: Callable[[str], None] = print) -> dict:
  """Converts an OpenCLIP checkpoint into `out_dir`/{params/, config.json}."""
  if model_config:
    try:
      with open(model_config) as f:
        open_clip_config = json.load(f)
    except json.JSONDecodeError as e:
      raise UserError(f"--model_config {model_config}: not valid JSON ({e})") from e
  else:
    open_clip_config = VIT_H_14
  cfg = clip_config(open_clip_config)
  params_dir = os.path.join(out_dir, PARAMS_DIR)
  if os.path.exists(params_dir):
    raise UserError(f"{params_dir} already exists; remove it or choose another out_dir")
  tensors = openclip_to_clipmodel(read_state_dict(checkpoint))
  check_fits(tensors, cfg, checkpoint)
  component = components.get(COMPONENT)
  specs = [st.TensorSpec(k, shape, dtype) for k, (shape, dtype, _) in tensors.items()]
  total = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in specs)
  os.makedirs(out_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix=".hps-clipmodel-", dir=out_dir) as tmp:
    with open(os.path.join(tmp, component.config_name), "w") as f:
      json.dump(cfg.to_hf(), f, indent=2)
    st.write_safetensors(tmp, component.weights_name, specs, lambda key: tensors[key][2](),
                         max_shard_size=total + 1)
    plan, reader = hf_to_flax.plan_component(component, tmp)
    result = hf_to_flax.convert_component(component, tmp, out_dir, plan, reader)
  log(f"converted {checkpoint}: {result['tensors']} tensors, {result['bytes'] / 1e9:.3f} GB -> {out_dir}")
  return result


def main(argv=None) -> int:
  p = errors.ArgumentParser(prog="python -m checkpoints_convert.hps", description=__doc__.splitlines()[0])
  p.add_argument("--checkpoint", required=True, help="the OpenCLIP torch file (HPS_v2.1_compressed.pt)")
  p.add_argument("--out_dir", required=True, help="where config.json and params/ are written")
  p.add_argument("--model_config", default="", help="OpenCLIP's model config JSON (default: ViT-H-14's)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  return run_command(lambda: convert_hps(args.checkpoint, args.out_dir, args.model_config))


if __name__ == "__main__":
  sys.exit(main())
