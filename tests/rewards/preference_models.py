"""Tiny HPS v2.1 and ImageReward folders, each made by its reference's own code and converted by the command users
run, once per session (tests/shared_runs.py): the parity tests and the training run on both rewards read them.

`hps(shared_runs)`: open_clip's CLIP saved as HPS releases it (tests/rewards/open_clip_oracle.py, in a process of its
own), its reference scores, `python -m checkpoints_convert.hps`'s folder and a CLIP tokenizer.
`image_reward(shared_runs)`: transformers' BLIP modules and ImageReward's MLP saved under BLIP's own key names as
`ImageReward.pt`, `python -m checkpoints_convert.image_reward`'s folder, a BERT vocabulary, and `ImageReward.score`'s
computation on them (`reference.npz`; see tests/rewards/test_image_reward.py for why transformers' BLIP).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.cli import ROOT, TIMEOUT_S, without_torch


def _convert(module: str, *flags) -> None:
  """The converter as users without torch run it (docs/install.md: torch is never needed)."""
  done = subprocess.run(without_torch(module, *flags), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "-> " in done.stdout, done.stdout


def _make_hps(out) -> None:
  from tests.models.clip import tiny

  made = subprocess.run([sys.executable, "-m", "tests.rewards.open_clip_oracle", f"--out={out}"], cwd=ROOT,
                        capture_output=True, text=True, timeout=TIMEOUT_S)
  assert made.returncode == 0, made.stderr[-3000:]
  _convert("checkpoints_convert.hps", f"--checkpoint={out / 'hps.pt'}",
           f"--model_config={out / 'model_config.json'}", f"--out_dir={out / 'converted'}")
  assert not list((out / "converted").glob(".hps-clipmodel-*"))  # its temporary file is gone
  tiny.tiny_tokenizer().save_pretrained(str(out / "tokenizer"))


def hps(shared_runs):
  """The folder: hps.pt, model_config.json, reference.npz, counts.json, converted/, tokenizer/."""
  return shared_runs("hps_tiny", _make_hps)


# Uneven on purpose: the ViT's 2 heads of 64 (the converter's width / 64), the text encoder's 4 heads of 32 (from
# med_config.json), a text FFN of 96, a head of other widths than the released ones.
IR_VISION = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                 patch_size=8, layer_norm_eps=1e-6, hidden_act="gelu")
IR_WORDS = ("a", "red", "cat", "on", "the", "blue", "sofa", "photo", "of", "dog", "sign", "that", "says", "hello")
IR_TEXT = dict(vocab_size=5 + len(IR_WORDS) + 3, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=40, encoder_hidden_size=128, layer_norm_eps=1e-12,
               hidden_act="gelu", is_decoder=True, pad_token_id=0, bos_token_id=2, sep_token_id=3)
IR_HEAD = (24, 12, 8, 4)
IR_PROMPTS = ["a red cat on the blue sofa", "photo of a dog", "a sign that says hello", "cat"]
# A downscale, a non-square image whose crop margin (39 - 32 = 7) starts at torchvision's 4 (CLIP's floor: 3), an
# upscale.
IR_SIZES = ((64, 64), (40, 49), (24, 24))
IR_MAX_TOKENS = 35  # ImageReward's prompt length


def _blip_vision_key(key: str) -> str:
  """transformers' BlipVisionModel name -> BLIP's `models/vit.py` VisionTransformer name."""
  for hf, blip in (("embeddings.class_embedding", "cls_token"), ("embeddings.position_embedding", "pos_embed"),
                   ("embeddings.patch_embedding", "patch_embed.proj"), ("post_layernorm", "norm"),
                   ("encoder.layers.", "blocks."), ("layer_norm1", "norm1"), ("layer_norm2", "norm2"),
                   ("self_attn.qkv", "attn.qkv"), ("self_attn.projection", "attn.proj")):
    key = key.replace(hf, blip)
  return key


def _pil_preprocess(images: np.ndarray, size: int) -> np.ndarray:
  """ImageReward's `_transform(size)` written out: PIL's bicubic resize of the shortest side (torchvision's Resize
  of a PIL image: the long side int(size * long / short)), torchvision's CenterCrop offsets, ToTensor, Normalize."""
  from PIL import Image

  from glmrl.models.clip.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

  out = []
  for image in images:
    h, w = image.shape[:2]
    new_long = int(size * max(h, w) / min(h, w))
    nh, nw = (size, new_long) if h <= w else (new_long, size)
    resized = np.asarray(Image.fromarray(image).resize((nw, nh), Image.BICUBIC), np.float32) / 255
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    crop = resized[top:top + size, left:left + size]
    out.append((crop - np.asarray(OPENAI_CLIP_MEAN)) / np.asarray(OPENAI_CLIP_STD))
  return np.stack(out).astype(np.float32)


def _make_image_reward(out) -> None:
  import jax.numpy as jnp
  import torch
  from torch import nn
  from transformers import BertTokenizerFast, BlipTextConfig, BlipTextModel, BlipVisionConfig, BlipVisionModel

  from glmrl.models.blip.config import MEAN, STD
  from glmrl.models.clip.preprocess import preprocess
  from glmrl.rewards import image_reward as image_reward_lib

  torch.manual_seed(0)
  vision = BlipVisionModel(BlipVisionConfig(**IR_VISION)).eval()
  text = BlipTextModel(BlipTextConfig(**IR_TEXT), add_pooling_layer=False).eval()
  widths = (IR_TEXT["hidden_size"], *IR_HEAD, 1)
  layers = []  # ImageReward's MLP: Linears at 0, 2, 4, 6, 7 with Dropouts between, no activations
  for i in range(len(widths) - 1):
    layers.append(nn.Linear(widths[i], widths[i + 1]))
    if i < len(widths) - 3:
      layers.append(nn.Dropout(0.1))
  mlp = nn.Sequential(*layers).eval()
  with torch.no_grad():  # every parameter random, LayerNorms and biases included; the head's widths kept
    for module in (vision, text, mlp):
      for p in module.parameters():
        p.normal_(0.0, 0.2 if p.ndim == 1 else (p.shape[1] ** -0.5 if module is mlp else 0.1))
  state = {f"blip.visual_encoder.{_blip_vision_key(k)}": v for k, v in vision.state_dict().items()}
  state.update({f"blip.text_encoder.{k}": v for k, v in text.state_dict().items()})
  # What BLIP's own modules also save: med.py's persistent position-id buffer, BLIP_Pretrain's projections.
  state["blip.text_encoder.embeddings.position_ids"] = torch.arange(IR_TEXT["max_position_embeddings"])[None]
  for name, width in (("vision_proj", IR_VISION["hidden_size"]), ("text_proj", IR_TEXT["hidden_size"])):
    state.update({f"blip.{name}.weight": torch.randn(8, width), f"blip.{name}.bias": torch.randn(8)})
  state.update({f"mlp.layers.{k}": v for k, v in mlp.state_dict().items()})
  torch.save(state, out / "ImageReward.pt")
  (out / "med_config.json").write_text(json.dumps({"num_attention_heads": IR_TEXT["num_attention_heads"],
                                                   "layer_norm_eps": IR_TEXT["layer_norm_eps"]}))
  (out / "bert").mkdir()
  (out / "bert" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *IR_WORDS]) + "\n")
  _convert("checkpoints_convert.image_reward", f"--checkpoint={out / 'ImageReward.pt'}",
           f"--med_config={out / 'med_config.json'}", f"--out_dir={out / 'converted'}")

  # ImageReward.score: its tokenizer call, the ViT's tokens, the text encoder attending to all of them, the head.
  tokens = BertTokenizerFast.from_pretrained(str(out / "bert"))(IR_PROMPTS, padding="max_length", truncation=True,
                                                                  max_length=IR_MAX_TOKENS, return_tensors="pt")
  arrays = {"ids": tokens.input_ids.numpy(), "mask": tokens.attention_mask.numpy()}
  rng = np.random.default_rng(0)
  size = IR_VISION["image_size"]
  for h, w in IR_SIZES:
    # Each image its own colour under noise: images the scores tell apart.
    colour = rng.integers(0, 256, size=(len(IR_PROMPTS), 1, 1, 3))
    images = np.clip(colour + rng.integers(-40, 41, size=(len(IR_PROMPTS), h, w, 3)), 0, 255).astype(np.uint8)
    # The model's parity is checked on the same pixels; the preprocessing apart, against PIL's.
    pixels = np.asarray(preprocess(jnp.asarray(images), image_reward_lib.preprocessing(size)))
    with torch.no_grad():
      image = vision(pixel_values=torch.from_numpy(pixels.copy()).permute(0, 3, 1, 2)).last_hidden_state
      hidden = text(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, encoder_hidden_states=image,
                    encoder_attention_mask=torch.ones(image.shape[:2], dtype=torch.long)).last_hidden_state
      scores = ((mlp(hidden[:, 0]) - MEAN) / STD)[:, 0].double().numpy()
    arrays.update({f"images_{h}x{w}": images, f"pixels_{h}x{w}": pixels, f"scores_{h}x{w}": scores,
                   f"pil_pixels_{h}x{w}": _pil_preprocess(images, size)})
  np.savez(out / "reference.npz", **arrays)


def image_reward(shared_runs):
  """The folder: ImageReward.pt, med_config.json, bert/ (vocab.txt), converted/, reference.npz."""
  return shared_runs("image_reward_tiny", _make_image_reward)
