"""Registry of the GLM-Image checkpoint components (one sub-folder each).

Classes and rule tables are named by import path and imported on first use,
so converting one component never needs the others' code.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os

import jax
from flax import nnx

from checkpoints_convert import rules as rules_lib
from glmrl.checkpoint import params as params_lib
from glmrl.errors import UserError
from glmrl.models.init_rngs import InitRngs

MODEL_INDEX = "model_index.json"
# Non-weight folders of the pipeline, copied verbatim in both directions.
COPIED_FOLDERS = ("processor", "tokenizer", "scheduler")


def _import(path: str):
  module, _, attr = path.partition(":")
  return getattr(importlib.import_module(module), attr)


@dataclasses.dataclass(frozen=True)
class Component:
  """One model folder: how to build it in Flax and how its HF files are named."""
  name: str                   # HF sub-folder
  config_cls: str             # "module:Class" with from_hf(dict) / to_hf()
  model_cls: str              # "module:Class" built as Class(cfg, rngs=...)
  rules: str                  # module holding RULES
  weights_name: str           # single-file name; sharded adds -0000i-of-0000n / .index.json
  library: tuple[str, str]    # (library, class) as model_index.json lists it
  config_name: str = "config.json"

  def config_class(self):
    return _import(self.config_cls)

  def model_class(self):
    return _import(self.model_cls)

  def key_map(self) -> rules_lib.KeyMap:
    return _key_map(self.rules)

  def read_config(self, directory: str) -> dict:
    path = os.path.join(directory, self.config_name)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{self.name}: no {path}")
    with open(path) as f:
      try:
        return json.load(f)
      except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from e

  def config_from_hf(self, config_dict: dict, **overrides):
    cfg = self.config_class().from_hf(config_dict)
    return dataclasses.replace(cfg, **overrides) if overrides else cfg

  def build_abstract(self, cfg):
    """The model with ShapeDtypeStruct leaves (nothing allocated)."""
    model_cls = self.model_class()
    return nnx.eval_shape(lambda: model_cls(cfg, rngs=InitRngs(0)))

  def build(self, cfg):
    """(graphdef, abstract Param state, concrete non-Param state) of the model.

    Non-Param variables (RNG counters, buffers) are computed under jit, where
    the unused parameter initialisers are dead code, so no weights are made.
    """
    model_cls = self.model_class()
    abstract = self.build_abstract(cfg)
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    if jax.tree.leaves(rest):
      rest = jax.jit(lambda: nnx.split(model_cls(cfg, rngs=InitRngs(0)), nnx.Param, ...)[2])()
    return graphdef, params, rest


@functools.lru_cache(maxsize=None)
def _key_map(module: str) -> rules_lib.KeyMap:
  return rules_lib.KeyMap(importlib.import_module(module).RULES)


_TRANSFORMERS_WEIGHTS = "model.safetensors"
_DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors"

COMPONENTS: dict[str, Component] = {c.name: c for c in (
    Component(
        name="vision_language_encoder",
        config_cls="glmrl.models.ar.config:ARConfig",
        model_cls="glmrl.models.ar.model:GlmImageAR",
        rules="checkpoints_convert.maps.ar",
        weights_name=_TRANSFORMERS_WEIGHTS,
        library=("transformers", "GlmImageForConditionalGeneration"),
    ),
    Component(
        name="transformer",
        config_cls="glmrl.models.dit.config:DiTConfig",
        model_cls="glmrl.models.dit.model:GlmImageDiT",
        rules="checkpoints_convert.maps.dit",
        weights_name=_DIFFUSERS_WEIGHTS,
        library=("diffusers", "GlmImageTransformer2DModel"),
    ),
    Component(
        name="vae",
        config_cls="glmrl.models.vae.config:VAEConfig",
        model_cls="glmrl.models.vae.model:AutoencoderKL",
        rules="checkpoints_convert.maps.vae",
        weights_name=_DIFFUSERS_WEIGHTS,
        library=("diffusers", "AutoencoderKL"),
    ),
    Component(
        name="text_encoder",
        config_cls="glmrl.models.glyph.config:T5EncoderConfig",
        model_cls="glmrl.models.glyph.t5:T5Encoder",
        rules="checkpoints_convert.maps.glyph",
        weights_name=_TRANSFORMERS_WEIGHTS,
        library=("transformers", "T5EncoderModel"),
    ),
    # Not part of GLM-Image: the CLIP reward models (a transformers CLIPModel folder of its own,
    # converted with `python -m checkpoints_convert.clip`).
    Component(
        name="clip",
        config_cls="glmrl.models.clip.config:ClipConfig",
        model_cls="glmrl.models.clip.model:ClipModel",
        rules="checkpoints_convert.maps.clip",
        weights_name=_TRANSFORMERS_WEIGHTS,
        library=("transformers", "CLIPModel"),
    ),
)}


def get(name: str) -> Component:
  if name not in COMPONENTS:
    raise UserError(f"unknown component {name!r}; known: {sorted(COMPONENTS)}")
  return COMPONENTS[name]


def load_component(component_dir: str, sharding=None, **config_overrides):
  """A converted component folder as its nnx model (the folder name picks the component, e.g.
  .../transformer); keyword arguments replace config fields (e.g. param_dtype=jnp.bfloat16).
  `sharding`: where every parameter goes (default: the first device)."""
  component = get(os.path.basename(os.path.normpath(component_dir)))
  cfg = component.config_from_hf(component.read_config(component_dir), **config_overrides)
  graphdef, abstract, rest = component.build(cfg)
  params = params_lib.restore_params(component_dir, abstract, sharding or params_lib.first_device())
  return nnx.merge(graphdef, params, rest)


def is_weights_file(filename: str) -> bool:
  """Weight files and their indexes (never copied verbatim)."""
  for ext in (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5"):
    if filename.endswith(ext) or filename.endswith(ext + ".index.json"):
      return True
  return False
