"""All of GLM-Image's components together: consistent configs, abstract models, parameters.

Parameters are built from abstract shapes (`nnx.eval_shape`) straight onto their shardings:
either a jitted random init (presets) or a restore of a converted checkpoint
(`python -m checkpoints_convert` output), so a full-size model is never materialised on one host.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from flax import nnx

from glmrl import sharding as sharding_lib
from glmrl.checkpoint import params as params_lib
from glmrl.errors import UserError
from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.image_processing import ImageProcessorConfig
from glmrl.models.ar.model import GlmImageAR
from glmrl.models.dit.config import DiTConfig
from glmrl.models.dit.model import GlmImageDiT
from glmrl.models.glyph.config import T5EncoderConfig
from glmrl.models.glyph.t5 import T5Encoder
from glmrl.models import init_draws
from glmrl.models.init_rngs import InitRngs
from glmrl.models.vae.config import VAEConfig
from glmrl.models.vae.model import AutoencoderKL
from glmrl.models.scheduler import SchedulerConfig

# name -> (checkpoint sub-folder, model class)
COMPONENTS = {
    "ar": ("vision_language_encoder", GlmImageAR),
    "dit": ("transformer", GlmImageDiT),
    "vae": ("vae", AutoencoderKL),
    "glyph": ("text_encoder", T5Encoder),
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class GlmImageConfigs:
  ar: ARConfig
  dit: DiTConfig
  vae: VAEConfig
  glyph: T5EncoderConfig
  scheduler: SchedulerConfig
  image_processor: ImageProcessorConfig

  def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
    """(C, h, w) of one image's DiT latents."""
    f = self.vae.scale_factor
    return self.dit.in_channels, height // f, width // f

  def check_consistent(self) -> None:
    """The components must agree on the sizes they exchange."""
    pairs = (
        ("transformer prior_vq_quantizer_codebook_size", self.dit.prior_vq_quantizer_codebook_size,
         "vision_language_encoder vq num_embeddings", self.ar.vq.num_embeddings),
        ("transformer text_embed_dim", self.dit.text_embed_dim, "text_encoder d_model", self.glyph.d_model),
        ("transformer in_channels", self.dit.in_channels, "vae latent_channels", self.vae.latent_channels),
        ("vae scale factor x transformer patch_size x 2", self.vae.scale_factor * self.dit.patch_size * 2,
         "the AR token size (32 px)", 32),
    )
    for name_a, a, name_b, b in pairs:
      if a != b:
        raise ValueError(f"inconsistent GLM-Image components: {name_a}={a} but {name_b}={b}")


def preset_configs(name: str) -> GlmImageConfigs:
  """`full`: the released sizes; `tiny`: a small model whose components fit together (tests, demo)."""
  if name == "full":
    # The released vision encoder's patch layout; the pixel budget of the reference `smart_resize`
    # defaults keeps condition images up to 2048 px on the 32 px token grid the decoder reads.
    image_cfg = dataclasses.replace(ImageProcessorConfig.full(), max_pixels=2048 * 2048)
    return GlmImageConfigs(ARConfig.full(), DiTConfig.full(), VAEConfig.full(), T5EncoderConfig.full(),
                           SchedulerConfig.full(), image_cfg)
  if name != "tiny":
    raise ValueError(f"unknown preset {name!r}; expected 'tiny' or 'full'")
  ar = ARConfig.tiny()
  # A text vocabulary wide enough for a word-level demo tokenizer. Condition images are tokenized
  # as released: at half resolution in 16 px patches, one VQ token per 32 px, so their grid is the
  # target grid the decoder upsamples x2 (ARConfig.tiny's 4 px patches would give a 4x finer one).
  ar = dataclasses.replace(ar, text=dataclasses.replace(ar.text, vocab_size=512),
                           vision=dataclasses.replace(ar.vision, patch_size=16, image_size=64))
  image_cfg = ImageProcessorConfig(patch_size=16, temporal_patch_size=1, merge_size=1, min_pixels=32 * 32,
                                   max_pixels=1024 * 1024)
  glyph = T5EncoderConfig.tiny()
  vae = VAEConfig.tiny(block_out_channels=(8, 8, 16, 16))  # 8x downsampling, as released
  dit = DiTConfig.tiny(prior_vq_quantizer_codebook_size=ar.vq.num_embeddings, text_embed_dim=glyph.d_model,
                       in_channels=vae.latent_channels, out_channels=vae.latent_channels)
  return GlmImageConfigs(ar, dit, vae, glyph, SchedulerConfig.full(), image_cfg)


class CheckpointFolderError(UserError, FileNotFoundError):
  """`model.checkpoint_dir` is not a converted GLM-Image folder (a file is missing)."""


def checkpoint_configs(checkpoint_dir: str) -> GlmImageConfigs:
  """Configs of a converted GLM-Image folder (each component's config.json)."""
  def read(*parts):
    path = os.path.join(checkpoint_dir, *parts)
    if not os.path.isfile(path):
      raise CheckpointFolderError(f"{path} not found: is {checkpoint_dir} a converted GLM-Image folder "
                              "(python -m checkpoints_convert --hf_dir=... --out_dir=...)?")
    with open(path) as f:
      return json.load(f)

  processor_dir = os.path.join(checkpoint_dir, "processor")
  preprocessor = os.path.join(processor_dir, "preprocessor_config.json")
  image_cfg = ImageProcessorConfig.from_hf(read("processor", "preprocessor_config.json")) \
      if os.path.isfile(preprocessor) else ImageProcessorConfig()
  return GlmImageConfigs(
      ar=ARConfig.from_hf(read("vision_language_encoder", "config.json")),
      dit=DiTConfig.from_hf(read("transformer", "config.json")),
      vae=VAEConfig.from_hf(read("vae", "config.json")),
      glyph=T5EncoderConfig.from_hf(read("text_encoder", "config.json")),
      scheduler=SchedulerConfig.from_hf(read("scheduler", "scheduler_config.json")),
      image_processor=image_cfg)


def with_dtypes(configs: GlmImageConfigs, *, param_dtype, compute_dtype, remat: bool,
                dit_attention: str | None = None, dit_cfg_batched: bool = False) -> GlmImageConfigs:
  """The trained AR model takes the run's dtypes and remat; frozen models compute in compute_dtype;
  `dit_attention`: the DiT's attention kernel (`glmrl.models.dit.attention.IMPLS`; None: "xla")."""
  replace = dataclasses.replace
  return replace(
      configs,
      ar=replace(configs.ar, param_dtype=param_dtype, dtype=compute_dtype, remat=remat),
      dit=replace(configs.dit, param_dtype=compute_dtype, dtype=compute_dtype, attention_impl=dit_attention,
                  cfg_batched=dit_cfg_batched),
      vae=replace(configs.vae, param_dtype=compute_dtype, dtype=compute_dtype),
      glyph=replace(configs.glyph, param_dtype=compute_dtype, dtype=compute_dtype))


def abstract_model(name: str, cfg):
  """(graphdef, abstract param state) of one component, no memory allocated."""
  graphdef, state = _abstract_model(name, cfg)
  return graphdef, jax.tree.map(lambda x: x, state)  # a State of its own: callers may change theirs


# A run builds a component abstractly more than once (the LoRA targets checked before any weight is made, then
# the build itself; `--mode=compile`), as every process that builds it again does: each build traces the module.
@functools.lru_cache(maxsize=16)
def _abstract_model(name: str, cfg):
  _, cls = COMPONENTS[name]
  return nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=InitRngs(0))))


# XLA:CPU spends most of a random init compiling one kernel per parameter (12 s of the tiny VAE's 13 s);
# backend optimisation level 1 compiles them 2-3x faster and the values stay bit-identical (tests/models).
_CPU_INIT_OPTIONS = {"xla_backend_optimization_level": 1}


def init_params(name: str, cfg, seed: int, shardings):
  """Random parameters of one component, created directly on `shardings` by the jitted init (`_init_program`,
  made once per process for each component, config and shardings). The seed's key is the programs' argument, not a
  constant in them: runs and tests that build one config from other seeds load the same compiled init from the
  persistent cache."""
  leaves, treedef = jax.tree.flatten(shardings)
  return _init_program(name, cfg, tuple(leaves), treedef)(jax.random.key(seed))


@functools.lru_cache(maxsize=16)
def _init_program(name: str, cfg, sharding_leaves: tuple, sharding_treedef):
  """key -> parameters: the init as two jitted programs, its draws batched in the first (`init_draws`), their
  output replicated on the parameters' mesh."""
  _, cls = COMPONENTS[name]

  def init(key):
    return nnx.split(cls(cfg, rngs=InitRngs(key)))[1]

  shardings = jax.tree.unflatten(sharding_treedef, sharding_leaves)
  draw, place = init_draws.split(init, jax.random.key(0))
  mesh = next((s.mesh for s in sharding_leaves if isinstance(s, NamedSharding)), None)
  options = _CPU_INIT_OPTIONS if jax.default_backend() == "cpu" else None
  draw = jax.jit(draw, out_shardings=NamedSharding(mesh, P()) if mesh else None, compiler_options=options)
  place = jax.jit(place, out_shardings=shardings, compiler_options=options)
  return lambda key: place(key, draw(key))


def build(name: str, cfg, *, mesh=None, checkpoint_dir: str = "", seed: int = 0):
  """(graphdef, params) of one component: restored from checkpoint_dir, or randomly initialised."""
  graphdef, abstract = abstract_model(name, cfg)
  shardings = None
  if mesh is not None:
    sharding_lib.warn_undivided(name, abstract, mesh)
    shardings = sharding_lib.state_shardings(abstract, mesh)
  if checkpoint_dir:
    folder, _ = COMPONENTS[name]
    params = params_lib.restore_params(os.path.join(checkpoint_dir, folder), abstract,
                                       shardings or params_lib.first_device())
  else:
    params = init_params(name, cfg, seed, shardings)
  return graphdef, params
