"""Tiny CLIP test assets: a byte-level BPE tokenizer, reference torch models, HF folders, converted folders.

The real CLIP vocabulary cannot be downloaded here, so the tokenizer is transformers' CLIPTokenizer
(a `tokenizers` BPE with CLIP's normaliser and pre-tokeniser) over the 256 byte symbols, their
end-of-word forms and a few merges. As in the released vocabulary the end-of-text token has the
largest id, which the legacy (eos_token_id=2) pooling relies on. Folders are written once per test
session into a temporary directory.
"""

from __future__ import annotations

import atexit
import functools
import json
import pathlib
import shutil
import tempfile

import glmrl  # noqa: F401

import numpy as np
import safetensors.torch
import torch
import transformers
from tokenizers import pre_tokenizers

from glmrl.models.clip import ClipConfig
from glmrl.models.clip.preprocess import ImageProcessing

MERGES = ("t h", "th e</w>", "a n", "an d</w>", "c a", "ca t</w>", "d o", "do g</w>")
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
LEGACY_BUFFERS = ("text_model.embeddings.position_ids", "vision_model.embeddings.position_ids")


def tiny_tokenizer() -> transformers.CLIPTokenizer:
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  tokens = alphabet + [c + "</w>" for c in alphabet] + ["".join(m.split()) for m in MERGES] + [BOS, EOS]
  return transformers.CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split()) for m in MERGES])


EOS_ID = 2 * 256 + len(MERGES) + 1


def config(variant: str = "legacy") -> ClipConfig:
  """'legacy': eos_token_id=2 (argmax pooling) and QuickGELU, like openai ViT-L/14; 'gelu': the real
  end-of-text id (first-eos pooling) and exact GELU, like ViT-H/14."""
  cfg = ClipConfig.tiny()
  if variant == "legacy":
    return cfg
  if variant == "gelu":
    import dataclasses
    return dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, eos_token_id=EOS_ID, hidden_act="gelu"),
                               vision=dataclasses.replace(cfg.vision, hidden_act="gelu"))
  raise ValueError(variant)


def reference_model(cfg: ClipConfig, seed: int = 0) -> transformers.CLIPModel:
  """transformers' CLIPModel with random weights; LayerNorms and the logit scale are randomised too
  (they initialise to constants, which would hide a wrong key map)."""
  torch.manual_seed(seed)
  model = transformers.CLIPModel(transformers.CLIPConfig(**cfg.to_hf())).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or "layrnorm" in name:
        p.add_(0.1 * torch.randn_like(p))
    model.logit_scale.fill_(3.1)
  return model


def write_hf_folder(path: pathlib.Path, model: transformers.CLIPModel, *, layout: str = "clean") -> pathlib.Path:
  """config.json, tokenizer and preprocessor files, and weights: 'clean' (model.safetensors as
  transformers 5 saves it), 'legacy' (plus the pre-4.31 position_ids buffers) or 'bin'
  (pytorch_model.bin only, with the buffers)."""
  path.mkdir(parents=True, exist_ok=True)
  model.config.to_json_file(str(path / "config.json"))
  tiny_tokenizer().save_pretrained(str(path))
  with open(path / "preprocessor_config.json", "w") as f:
    json.dump({**ImageProcessing.tiny(model.config.vision_config.image_size).to_hf(),
               "image_processor_type": "CLIPImageProcessor"}, f)
  sd = {k: v.contiguous() for k, v in model.state_dict().items()}
  if layout != "clean":
    sd["text_model.embeddings.position_ids"] = torch.arange(model.config.text_config.max_position_embeddings)[None]
    n = (model.config.vision_config.image_size // model.config.vision_config.patch_size) ** 2 + 1
    sd["vision_model.embeddings.position_ids"] = torch.arange(n)[None]
  if layout == "bin":
    torch.save(sd, path / "pytorch_model.bin")
  else:
    safetensors.torch.save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
  return path


_ROOT = pathlib.Path(tempfile.mkdtemp(prefix="glmrl-clip-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def converted(variant: str = "legacy", seed: int = 0):
  """(converted folder, reference torch model) of a tiny CLIP, converted once per session."""
  from checkpoints_convert.clip import convert_clip

  model = reference_model(config(variant), seed)
  hf = write_hf_folder(_ROOT / f"{variant}-{seed}" / "hf", model)
  out = _ROOT / f"{variant}-{seed}" / "flax"
  convert_clip(str(hf), str(out), log=lambda s: None)
  return out, model


def random_images(shape, seed: int = 0) -> np.ndarray:
  """uint8 [B, H, W, 3]: noise in the first half of the batch, smooth gradients in the second."""
  rng = np.random.default_rng(seed)
  b, h, w = shape
  images = rng.integers(0, 256, (b, h, w, 3), dtype=np.uint8)
  yy, xx = np.mgrid[:h, :w]
  for i in range(b // 2, b):
    for c in range(3):
      images[i, ..., c] = (127 + 120 * np.sin(xx / (5.0 + i + c)) * np.cos(yy / (7.0 + c))).astype(np.uint8)
  return images


def reference_embeddings(model: transformers.CLIPModel, images=None, prompts=None):
  """Unit-norm (image, text) embeddings the torch way: CLIPImageProcessor (PIL), CLIPTokenizer
  padded to max_length, get_image_features / get_text_features."""
  from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

  out = []
  with torch.no_grad():
    if images is not None:
      proc = CLIPImageProcessorPil(**ImageProcessing.tiny(model.config.vision_config.image_size).to_hf())
      pixels = proc(images=list(images), return_tensors="pt")["pixel_values"]
      e = model.get_image_features(pixel_values=pixels).pooler_output
      out.append((e / e.norm(dim=-1, keepdim=True)).numpy())
    if prompts is not None:
      enc = tiny_tokenizer()(list(prompts), padding="max_length", truncation=True,
                             max_length=model.config.text_config.max_position_embeddings, return_tensors="pt")
      e = model.get_text_features(**enc).pooler_output
      out.append((e / e.norm(dim=-1, keepdim=True)).numpy())
  return out
