"""Tiny GLM-Image HF folders for the converter tests, written by the reference libraries.

`processor/` and `model_index.json` come from tests/fixtures/tiny_glm_image.py. The model
components are written here because the tests need them sharded
(`save_pretrained(max_shard_size=...)`), in chosen dtypes, and with the torch models kept
as output oracles; `scheduler/` and `tokenizer/` are the reference classes' own saves.
"""

from __future__ import annotations

import json
import pathlib

import diffusers
import numpy as np
import torch
import transformers

from glmrl.models.ar.config import ARConfig
from glmrl.models.dit.config import DiTConfig
from glmrl.models.glyph.config import T5EncoderConfig
from glmrl.models.vae.config import VAEConfig
from tests import shared_facts
from tests.fixtures import tiny_glm_image

MODEL_COMPONENTS = ("vision_language_encoder", "transformer", "vae", "text_encoder")
SCHEDULER_CONFIG = shared_facts.GLM_IMAGE / "scheduler_config.json"


def reference_model(name: str, seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
  """The reference torch model of a component, tiny config, random weights."""
  torch.manual_seed(seed)
  if name == "vision_language_encoder":
    model = transformers.GlmImageForConditionalGeneration(transformers.GlmImageConfig(**ARConfig.tiny().to_hf()))
  elif name == "transformer":
    model = diffusers.GlmImageTransformer2DModel.from_config(DiTConfig.tiny().to_hf())
  elif name == "vae":
    model = diffusers.AutoencoderKL.from_config(VAEConfig.tiny().to_hf())
  elif name == "text_encoder":
    model = transformers.T5EncoderModel(transformers.T5Config(**T5EncoderConfig.tiny().to_hf()))
  else:
    raise ValueError(f"unknown component {name!r}")
  return model.to(dtype).eval()


def reference_class(name: str):
  """The class model_index.json names for a component (what from_pretrained is called on)."""
  library, cls = json.loads(tiny_glm_image.MODEL_INDEX_FILE.read_text())[name]
  return getattr({"transformers": transformers, "diffusers": diffusers}[library], cls)


def reference_output(name: str, model: torch.nn.Module) -> torch.Tensor:
  """A deterministic forward of a component on fixed random inputs."""
  g = np.random.default_rng(1)
  dtype = next(model.parameters()).dtype
  with torch.no_grad():
    if name == "vision_language_encoder":
      ids = torch.from_numpy(g.integers(0, 150, (2, 7)))
      return model(input_ids=ids).logits
    if name == "text_encoder":
      return model(input_ids=torch.from_numpy(g.integers(0, 384, (2, 5)))).last_hidden_state
    if name == "vae":
      cfg = VAEConfig.tiny()
      z = torch.from_numpy(g.standard_normal((1, cfg.latent_channels, 4, 4)).astype(np.float32))
      return model.decode(z.to(dtype)).sample
    cfg = DiTConfig.tiny()
    h = w = 4
    n = (h // cfg.patch_size) * (w // cfg.patch_size)
    f32 = lambda *s: torch.from_numpy(g.standard_normal(s).astype(np.float32)).to(dtype)
    return model(hidden_states=f32(1, cfg.in_channels, h, w), encoder_hidden_states=f32(1, 3, cfg.text_embed_dim),
                 prior_token_id=torch.from_numpy(g.integers(0, cfg.prior_vq_quantizer_codebook_size, (1, n))),
                 prior_token_drop=torch.zeros(1, n, dtype=torch.bool),
                 timestep=torch.tensor([500.0], dtype=dtype), target_size=torch.tensor([[32.0, 32.0]], dtype=dtype),
                 crop_coords=torch.zeros(1, 2, dtype=dtype), return_dict=False)[0]


def write_pipeline_files(root: pathlib.Path):
  """model_index.json, processor/, tokenizer/, scheduler/."""
  tiny_glm_image.write_model_index(root)
  tiny_glm_image.write_processor(root)
  transformers.ByT5Tokenizer().save_pretrained(root / "tokenizer")
  scheduler_cfg = json.loads(SCHEDULER_CONFIG.read_text())
  diffusers.FlowMatchEulerDiscreteScheduler.from_config(scheduler_cfg).save_pretrained(root / "scheduler")


def write_folder(root, models: dict[str, torch.nn.Module], max_shard_size="40KB", pipeline_files=True):
  """`root`/<component>/ for each model (sharded when larger than max_shard_size) plus pipeline files."""
  root = pathlib.Path(root)
  root.mkdir(parents=True, exist_ok=True)
  for name, model in models.items():
    model.save_pretrained(root / name, max_shard_size=max_shard_size)
  if pipeline_files:
    write_pipeline_files(root)
  return root
