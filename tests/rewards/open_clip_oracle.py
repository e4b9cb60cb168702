"""OpenCLIP as HPS v2.1 runs it, the reference of tests/rewards/test_hps.py: a tiny random model built by
open_clip's own `CLIP`, saved as HPS releases its checkpoint, and the HPS scores of given images and prompts.

    python -m tests.rewards.open_clip_oracle --out=DIR

Writes DIR/hps.pt ({"state_dict": ...}), DIR/model_config.json (open_clip's model config layout),
DIR/reference.npz (per image size: the uint8 images, the prompts' token ids and `hpsv2.score`'s formula on them),
DIR/counts.json (parameters of open_clip's ViT-H-14 and of the tiny model, built on the meta device),
DIR/text_ids.npy (`TEXT_PROMPTS` tokenized by open_clip's own tokenizer) and DIR/open_clip_tokenizer/ (its
vocabulary and merges as a transformers tokenizer folder).

Run in a process of its own: open_clip imports torchvision at import time, and PyPI has no torchvision build for
a CPU-only torch on Linux (its wheel needs CUDA's libraries). torchvision's transforms are not used here, so this
process alone gets a stand-in module whose names exist and whose transforms raise if called; hpsv2's
preprocessing is written out below with torch's own resize (`torchvision.transforms.functional.resize` of a float
tensor is `torch.nn.functional.interpolate(..., antialias=True)`). hpsv2 itself does not import (its 1.2.0 wheel
lacks the vocabulary file its tokenizer opens at import).
"""

import argparse
import enum
import importlib.machinery
import json
import os
import sys
import types

import numpy as np

# Uneven sizes: 3 and 5 heads, a 4 x 4 patch grid of 7 px, widths that are no power of two.
MODEL_CONFIG = {"embed_dim": 24,
                "vision_cfg": {"image_size": 28, "layers": 2, "width": 48, "head_width": 16, "patch_size": 7},
                "text_cfg": {"context_length": 16, "vocab_size": 522, "width": 40, "heads": 5, "layers": 2}}
# (height, width) of each batch: downscaled square, downscaled and padded on both axes, upscaled.
SIZES = ((40, 40), (45, 30), (20, 26))
PROMPTS = ["a dog", "the cat and the dog", "cat", "and the dog and the cat and the dog"]
# What OpenCLIP's tokenizer cleans (HTML entities, mojibake, whitespace, case) or cuts (past 77 tokens), beside text
# any tokenizer keeps: tokenized by open_clip with its released vocabulary, as hpsv2 tokenizes a prompt.
TEXT_PROMPTS = ["a dog", "Tom &amp; Jerry", "&lt;b&gt;bold&lt;/b&gt;", "Ã©cole", "café crème brûlée",
                "  many   spaces\nand\tnewlines ", 'A RED Sign That Says "HELLO"', "don't!! stop...",
                "1024x1024 4k photo", "一只猫", "emoji 🐱🚀", " ".join(["word"] * 100)]
# open_clip's names of the start and end tokens -> transformers' (the same ids).
SPECIAL_TOKENS = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def _stand_in_torchvision() -> None:
  def unavailable(name):
    def refuse(*args, **kwargs):
      raise RuntimeError(f"torchvision.{name} is a stand-in here (tests/rewards/open_clip_oracle.py)")
    return type(name, (), {"__init__": refuse})

  modules = {n: types.ModuleType(n) for n in ("torchvision", "torchvision.transforms",
                                               "torchvision.transforms.functional", "torchvision.ops",
                                               "torchvision.ops.misc")}
  modules["torchvision"].__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
  transforms = modules["torchvision.transforms"]
  transforms.InterpolationMode = enum.Enum("InterpolationMode", ["NEAREST", "BILINEAR", "BICUBIC", "BOX",
                                                                 "HAMMING", "LANCZOS"])
  for name in ("Normalize", "Compose", "RandomResizedCrop", "ToTensor", "Resize", "CenterCrop", "ColorJitter",
               "Grayscale"):
    setattr(transforms, name, unavailable(name))
  modules["torchvision.ops.misc"].FrozenBatchNorm2d = unavailable("FrozenBatchNorm2d")
  sys.modules.update(modules)


def preprocess_val(image_uint8, size: int):
  """hpsv2's `preprocess_val` of one HxWx3 uint8 image: ToTensor, ResizeMaxSize(size, bicubic, fill=0),
  Normalize(OpenAI mean and std)."""
  import torch
  import torch.nn.functional as F

  x = torch.from_numpy(image_uint8).permute(2, 0, 1).float() / 255  # ToTensor
  height, width = x.shape[1:]
  scale = size / float(max(height, width))
  if scale != 1.0:
    new = tuple(round(dim * scale) for dim in (height, width))
    x = F.interpolate(x[None], size=new, mode="bicubic", align_corners=False, antialias=True)[0]
    pad_h, pad_w = size - new[0], size - new[1]
    x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=0.0)
  mean, std = torch.tensor(OPENAI_MEAN)[:, None, None], torch.tensor(OPENAI_STD)[:, None, None]
  return (x - mean) / std


def _token_ids(prompts, context_length: int) -> np.ndarray:
  """OpenCLIP's layout of the tiny CLIP tokenizer's ids: start, tokens, end, zeros to the context length."""
  from tests.models.clip import tiny

  ids = tiny.tiny_tokenizer()(prompts)["input_ids"]
  out = np.zeros((len(prompts), context_length), np.int64)
  for row, seq in enumerate(ids):
    out[row, :len(seq)] = seq
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  out = parser.parse_args().out
  _stand_in_torchvision()
  import open_clip
  import torch

  torch.manual_seed(0)
  model = open_clip.model.CLIP(**MODEL_CONFIG).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "ln" in name:  # LayerNorms initialise to ones and zeros, which would hide a wrong key map
        p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
    model.logit_scale.fill_(2.7)
  torch.save({"state_dict": model.state_dict()}, os.path.join(out, "hps.pt"))
  with open(os.path.join(out, "model_config.json"), "w") as f:
    json.dump(MODEL_CONFIG, f)

  size = MODEL_CONFIG["vision_cfg"]["image_size"]
  ids = _token_ids(PROMPTS, MODEL_CONFIG["text_cfg"]["context_length"])
  rng = np.random.default_rng(3)
  arrays = {"ids": ids}
  with torch.no_grad():
    text = model.encode_text(torch.from_numpy(ids), normalize=True)
    for h, w in SIZES:
      images = rng.integers(0, 256, (len(PROMPTS), h, w, 3), dtype=np.uint8)
      pixels = torch.stack([preprocess_val(im, size) for im in images])
      image = model.encode_image(pixels, normalize=True)
      arrays[f"images_{h}x{w}"] = images
      arrays[f"scores_{h}x{w}"] = torch.diagonal(image @ text.T).numpy()  # hpsv2.score's formula
  np.savez(os.path.join(out, "reference.npz"), **arrays)

  # open_clip's tokenizer as hpsv2 uses it (the released BPE it ships, 77 tokens), and its vocabulary and merges
  # written as a transformers CLIP tokenizer folder.
  tokenizer = open_clip.get_tokenizer("ViT-H-14")
  np.save(os.path.join(out, "text_ids.npy"), tokenizer(TEXT_PROMPTS).numpy())
  folder = os.path.join(out, "open_clip_tokenizer")
  os.makedirs(folder)
  with open(os.path.join(folder, "vocab.json"), "w") as f:
    json.dump({SPECIAL_TOKENS.get(k, k): v for k, v in tokenizer.encoder.items()}, f)
  merges = sorted(tokenizer.bpe_ranks.items(), key=lambda kv: kv[1])
  with open(os.path.join(folder, "merges.txt"), "w") as f:
    f.write("#version: 0.2\n" + "".join(" ".join(pair) + "\n" for pair, _ in merges))

  with torch.device("meta"):
    counts = {"ViT-H-14": sum(p.numel() for p in open_clip.model.CLIP(
        **open_clip.get_model_config("ViT-H-14")).parameters()),
              "tiny": sum(p.numel() for p in open_clip.model.CLIP(**MODEL_CONFIG).parameters())}
  with open(os.path.join(out, "counts.json"), "w") as f:
    json.dump(counts, f)


if __name__ == "__main__":
  main()
