"""Everything a run needs, built from the config: mesh, data, models, pipeline, rewards, optimizer.

Every check on the inputs happens here, before any model is built or compiled.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from absl import logging
from flax import nnx

from glmrl import sharding as sharding_lib
from glmrl.checkpoint.fingerprint import fingerprint
from glmrl.data import PromptIterator, load_prompts
from glmrl.errors import UserError
from glmrl.models import glm_image
from glmrl.models import lora as lora_lib
from glmrl.models.ar import tokenizer as word_tokenizer
from glmrl.models.ar.prompt import PromptProcessor
from glmrl.rewards import RewardComposer
from glmrl.sampling.logprobs import SamplingConfig
from glmrl.sampling.pipeline import GlmImagePipeline, PipelineSpec, check_decode_batch, check_glyph_fits
from glmrl.train import decoder_step
from glmrl.train import step as step_lib

# The AR model's parts that GRPO trains; the vision encoder and VQ stay frozen.
TRAINABLE = nnx.All(nnx.Param, nnx.Not(nnx.Any(nnx.PathContains("visual"), nnx.PathContains("vq"))))


@dataclasses.dataclass
class DecoderParts:
  """The DiT as the decoder policy trains it: its graphdef (with adapters under DiT LoRA), the trained state
  (the adapters, or every DiT parameter) and the rest (the base weights under LoRA)."""
  graphdef: object
  trainable: nnx.State
  frozen: nnx.State
  lora: lora_lib.LoraConfig

  def dit_params(self, trainable) -> tuple:
    """The pipeline's `dit_params` for a trained state."""
    return (trainable, self.frozen)


@dataclasses.dataclass
class Run:
  config: object
  mesh: jax.sharding.Mesh
  records: list
  eval_records: list
  iterator: PromptIterator
  composer: RewardComposer
  pipeline: GlmImagePipeline
  ar_graphdef: object
  trainable: nnx.State  # full fine-tuning: the decoder's parameters; LoRA: the adapters only
  frozen: nnx.State     # everything else of the AR generator (the base weights, with LoRA)
  lora: lora_lib.LoraConfig
  decoder: DecoderParts | None = None           # with "decoder" in config.train.policies
  decoder_composer: RewardComposer | None = None

  @property
  def policies(self) -> tuple[str, ...]:
    return tuple(self.config.train.policies.split("+"))

  @property
  def group_size(self) -> int:
    """Samples per prompt of evaluation and generation."""
    return self.config.grpo.group_size

  @property
  def ar_group(self) -> int:
    """Token grids per prompt in a rollout (1 when the AR policy does not train)."""
    return rollout_groups(self.config)[0]

  @property
  def decoder_group(self) -> int:
    """Decoder samples per token grid in a rollout (1 when the decoder policy does not train)."""
    return rollout_groups(self.config)[1]

  @property
  def batch_size(self) -> int:
    """Images per rollout."""
    return self.config.data.prompts_per_step * self.ar_group * self.decoder_group

  def checkpoint_params(self, trainable) -> nnx.State:
    """What a training checkpoint holds of the AR generator: the whole generator (the paths of a
    converted checkpoint, so it exports as one), or with LoRA only the adapters."""
    return trainable if self.lora.enabled else nnx.merge_state(trainable, self.frozen)

  def ar_params(self, saved) -> tuple:
    """The pipeline's `ar_params` of a checkpoint's params (`checkpoint_params`' output)."""
    return (saved, self.frozen) if self.lora.enabled else (saved,)


def rollout_groups(config) -> tuple[int, int]:
  """(token grids per prompt, decoder samples per grid) of a rollout: (grpo.group_size, 1) for "ar",
  (1, decoder.group_size) for "decoder", both for "ar+decoder"."""
  policies = config.train.policies.split("+")
  return (config.grpo.group_size if "ar" in policies else 1,
          config.decoder.group_size if "decoder" in policies else 1)


def check_batch(config, mesh_shape: tuple[int, int, int]) -> None:
  """The rollout's AR rows and images (and decoder chunks) must split evenly over data x fsdp; micro-batches
  need not.

  The fields' own rules (e.g. group_size >= 2) are `config_checks`', checked before this runs."""
  data, fsdp, _ = mesh_shape
  devices = data * fsdp
  ga, gd = rollout_groups(config)
  prompts = config.data.prompts_per_step
  rows, images = prompts * ga, prompts * ga * gd
  if rows % devices:
    what = "prompts_per_step x group_size = {} x {}".format(prompts, ga) if ga > 1 else f"prompts_per_step {prompts}"
    raise UserError(f"the AR sampler's rows {what} = {rows} do not divide over the mesh's data x fsdp = "
                     f"{data} x {fsdp} = {devices} devices")
  policies = config.train.policies.split("+")
  micro_batches = [("train", rows)] if "ar" in policies else []
  micro_batches += [("decoder", images)] if "decoder" in policies else []
  for section, batch in micro_batches:
    micro = config[section].micro_batch_size or batch
    if batch % micro:
      raise UserError(f"config.{section}.micro_batch_size={micro} does not divide its update's batch {batch}")
    if micro % devices:
      # Correct (XLA splits what it can and replicates the rest) but slower: e.g. micro-batches of 16 on a
      # 32-chip slice. Allowed, since the batch layout is the user's trade between memory and speed.
      logging.warning("config.%s.micro_batch_size=%d does not split evenly over data x fsdp = %d devices: "
                      "each micro-batch is partly replicated", section, micro, devices)
  chunk = config.sampling.decode_batch
  if chunk:
    check_decode_batch(chunk, images, ga * gd)
    if chunk % devices:
      raise UserError(f"config.sampling.decode_batch={chunk} does not split over data x fsdp = {devices}")


def sampling_config(config) -> SamplingConfig:
  s = config.sampling
  return SamplingConfig(temperature=float(s.temperature), top_p=float(s.top_p), top_k=int(s.top_k),
                        constrain_to_codebook=bool(s.constrain_to_codebook))


def update_spec(config, prompt_len: int, layout) -> step_lib.UpdateSpec:
  """The static description of the run's update for its prompt length and generation layout."""
  batch = config.data.prompts_per_step * config.grpo.group_size  # AR rows: one per token grid
  return step_lib.UpdateSpec(
      prompt_len=prompt_len, layout=layout, sampling=sampling_config(config),
      micro_batches=batch // (config.train.micro_batch_size or batch), epsilon_low=float(config.grpo.epsilon_low),
      epsilon_high=float(config.grpo.epsilon_high), beta=float(config.grpo.beta), kl=config.grpo.kl,
      aggregation=config.grpo.aggregation, remat=config.model.remat, tis_cap=float(config.grpo.tis_cap),
      reference="adapters_off" if config.lora.rank else "params")


def decoder_spec(config) -> decoder_step.DecoderSpec:
  """The static description of the run's decoder update."""
  d = config.decoder
  ga, gd = rollout_groups(config)
  images = config.data.prompts_per_step * ga * gd
  return decoder_step.DecoderSpec(
      noise_level=float(d.noise_level), guidance_scale=float(config.sampling.guidance_scale),
      clip_range=float(d.clip_range), adv_clip_max=float(d.adv_clip_max), beta=float(d.beta),
      micro_batches=images // (d.micro_batch_size or images), reference="adapters_off" if d.lora.rank else "params")


def pipeline_spec(config) -> PipelineSpec:
  return PipelineSpec(height=config.data.height, width=config.data.width, sampling=sampling_config(config),
                      dit_steps=config.sampling.dit_steps, guidance_scale=float(config.sampling.guidance_scale),
                      share_noise_in_group=config.sampling.share_noise_in_group,
                      prompt_pad=config.data.max_prompt_tokens, glyph_pad=config.data.max_glyph_tokens,
                      glyph_texts=config.data.max_glyph_texts, decode_batch=config.sampling.decode_batch)


def load_records(config):
  records = load_prompts(config.data.prompts_file)
  eval_records = load_prompts(config.eval.prompts_file) if config.eval.prompts_file else []
  for path, recs in ((config.data.prompts_file, records), (config.eval.prompts_file, eval_records)):
    for r in recs:
      if config.data.mode == "i2i" and not r.source_images:
        raise UserError(f"{path}:{r.line}: data.mode='i2i' needs source_images on every line")
      if config.data.mode == "t2i" and r.source_images:
        raise UserError(f"{path}:{r.line}: source_images given but data.mode='t2i' (set --config.data.mode=i2i)")
  return records, eval_records


def model_configs(config) -> glm_image.GlmImageConfigs:
  if config.model.checkpoint_dir:
    configs = glm_image.checkpoint_configs(config.model.checkpoint_dir)
  else:
    configs = glm_image.preset_configs(config.model.preset)
  configs.check_consistent()
  configs = glm_image.with_dtypes(configs, param_dtype=glm_image.DTYPES[config.model.param_dtype],
                                  compute_dtype=glm_image.DTYPES[config.model.compute_dtype],
                                  remat=config.model.remat,
                                  dit_attention={"xla": None}.get(config.model.dit_attention,
                                                                  config.model.dit_attention))
  if "decoder" in config.train.policies.split("+") and config.model.remat:
    # The decoder update differentiates the DiT: without per-block remat one 1024^2 sample's backward keeps
    # every block's activations and attention scores of both CFG branches (--mode=compile on v5p-64: 226 GB of
    # temporaries per chip for one sample per chip).
    configs = dataclasses.replace(configs, dit=dataclasses.replace(configs.dit, remat=True))
  return configs


def processors(config, configs, texts):
  """(GLM prompt processor, ByT5 glyph tokenizer): the checkpoint's, or word-level ones for random models."""
  from transformers import ByT5Tokenizer

  ckpt = config.model.checkpoint_dir
  if ckpt:
    glyph_dir = os.path.join(ckpt, "tokenizer")
    glyph_tok = ByT5Tokenizer.from_pretrained(glyph_dir) if os.path.isdir(glyph_dir) else ByT5Tokenizer()
    return PromptProcessor.from_pretrained(ckpt), glyph_tok
  return word_tokenizer.word_processor(configs.ar, configs.image_processor, texts), ByT5Tokenizer()


def reward_composer(config, mesh, rewards=None, group_size: int | None = None) -> RewardComposer:
  """The configured rewards (`rewards`: config.rewards by default); model-backed ones load their weights
  replicated on the mesh. `group_size`: the rows a per-group normalisation spans (default grpo.group_size)."""
  entries = [dict(e.to_dict() if hasattr(e, "to_dict") else e) for e in (rewards or config.rewards)]
  if config.normalize_rewards_per_group:
    entries = [dict(e, normalize=True) for e in entries]
  return RewardComposer(entries, group_size=group_size or config.grpo.group_size, std_eps=config.grpo.std_eps,
                        sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def check_prompt_lengths(processor, records, path, config) -> None:
  """Every text-to-image prompt must fit the fixed prompt length (one compilation per run).

  Image-to-image prompts are checked when their images are tokenized (`GlmImagePipeline.prepare`).
  """
  limit = config.data.max_prompt_tokens
  lengths = [(processor([r.prompt], config.data.height, config.data.width).input_ids.shape[1], r.line)
             for r in records if not r.source_images]
  too_long = [(n, line) for n, line in lengths if n > limit]
  if too_long:
    n, line = too_long[0]
    raise UserError(f"{path}:{line}: the prompt takes {n} tokens with its grids, more than "
                    f"config.data.max_prompt_tokens={limit} ({len(too_long)} prompt(s) too long; the longest "
                    f"needs --config.data.max_prompt_tokens={max(n for n, _ in too_long)})")


def build(config) -> Run:
  """Checks inputs, then builds the mesh, data, rewards, models and pipeline."""
  m = config.mesh
  try:
    mesh_shape = sharding_lib.mesh_shape(m.data, m.fsdp, m.tensor, jax.device_count())
  except ValueError as e:
    raise UserError(f"config.mesh: {e}") from None
  check_batch(config, mesh_shape)
  records, eval_records = load_records(config)
  mesh = sharding_lib.make_mesh(m.data, m.fsdp, m.tensor)
  ga, gd = rollout_groups(config)
  # The AR policy's rewards normalise over a prompt's rows; the decoder's over a token grid's samples.
  composer = reward_composer(config, mesh, group_size=ga * gd if "ar" in config.train.policies else None)
  decoder_composer = None
  if "decoder" in config.train.policies:
    decoder_composer = reward_composer(config, mesh, config.decoder.rewards, group_size=gd)
  configs = model_configs(config)
  processor, glyph_tokenizer = processors(config, configs, [r.prompt for r in records + eval_records])
  for path, recs in ((config.data.prompts_file, records), (config.eval.prompts_file, eval_records)):
    check_prompt_lengths(processor, recs, path, config)
    for r in recs:
      check_glyph_fits(r.prompt, glyph_tokenizer, config.data.max_glyph_tokens, config.data.max_glyph_texts,
                       where=f"{path}:{r.line}")
  iterator = PromptIterator(records, prompts_per_step=config.data.prompts_per_step, seed=config.seed,
                            height=config.data.height, width=config.data.width)

  logging.info("mesh %s on %d devices", dict(mesh.shape), jax.device_count())
  source = config.model.checkpoint_dir or f"a random {config.model.preset!r} preset"
  models = {}
  for i, name in enumerate(glm_image.COMPONENTS):
    logging.info("loading %s from %s", name, source)
    models[name] = glm_image.build(name, getattr(configs, name), mesh=mesh,
                                   checkpoint_dir=config.model.checkpoint_dir, seed=config.seed + i)
  ar_graphdef, ar_params = models["ar"]
  ar_model = nnx.merge(ar_graphdef, ar_params)
  lora = lora_config(config)
  if lora.enabled:
    graphdef, trainable, frozen = add_adapters(ar_model, lora, mesh, config.seed)
    logging.info("LoRA rank %d (alpha %g) on %d layers: %d trainable parameters", lora.rank, lora.alpha,
                 len(jax.tree.leaves(trainable)) // 2, num_params(trainable))
  else:
    graphdef, trainable, frozen = nnx.split(ar_model, TRAINABLE, ...)
  # The run owns the AR parameters (the update donates them); the pipeline gets them per call.
  models["ar"] = (graphdef, None)
  decoder = None
  if "decoder" in config.train.policies:
    decoder = decoder_parts(config, models["dit"], mesh)
    models["dit"] = (decoder.graphdef, None)  # as the AR: the run owns the trained DiT
  pipeline = GlmImagePipeline(configs, models, processor, glyph_tokenizer, pipeline_spec(config), mesh=mesh)
  return Run(config, mesh, records, eval_records, iterator, composer, pipeline, graphdef, trainable, frozen, lora,
             decoder, decoder_composer)


def decoder_parts(config, dit_model, mesh) -> DecoderParts:
  """The DiT split for the decoder policy: adapters (config.decoder.lora) or all its parameters trained."""
  graphdef, state = dit_model
  model = nnx.merge(graphdef, state)
  c = config.decoder.lora
  lora = lora_lib.LoraConfig(rank=c.rank, alpha=float(c.alpha), targets=lora_lib.target_patterns(c.targets))
  if lora.enabled:
    graphdef, trainable, frozen = add_adapters(model, lora, mesh, config.seed, salt=0xD17)
    logging.info("DiT LoRA rank %d (alpha %g) on %d layers: %d trainable parameters", lora.rank, lora.alpha,
                 len(jax.tree.leaves(trainable)) // 2, num_params(trainable))
  else:
    graphdef, trainable, frozen = nnx.split(model, nnx.Param, ...)
  return DecoderParts(graphdef, trainable, frozen, lora)


def lora_config(config) -> lora_lib.LoraConfig:
  return lora_lib.LoraConfig(rank=config.lora.rank, alpha=float(config.lora.alpha),
                             targets=lora_lib.target_patterns(config.lora.targets))


def adapters_record(run) -> dict | None:
  """What a LoRA run's checkpoints record of its adapters and their base (`check_adapters`); None
  for full fine-tuning. The base is named by its folder (or preset and seed) and a fingerprint of
  its weights (`glmrl.checkpoint.fingerprint`), so adapters never resume onto another base."""
  return _adapters_record(run.config, run.lora, run.frozen)


def decoder_adapters_record(run) -> dict | None:
  """`adapters_record` of the DiT's adapters (decoder_lora.json); None without DiT LoRA or decoder policy."""
  return None if run.decoder is None else _adapters_record(run.config, run.decoder.lora, run.decoder.frozen)


def _adapters_record(cfg, lora: lora_lib.LoraConfig, base) -> dict | None:
  if not lora.enabled:
    return None
  source = os.path.abspath(cfg.model.checkpoint_dir) if cfg.model.checkpoint_dir else \
      f"random preset {cfg.model.preset!r}, seed {cfg.seed}, {cfg.model.param_dtype}"
  return {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets),
          "base": {"checkpoint_dir": source, "fingerprint": fingerprint(base)}}


def add_adapters(model, lora: lora_lib.LoraConfig, mesh, seed: int, salt: int = 0x10FA):
  """(graphdef, adapters, base) of `model` with adapters attached: the adapters placed by the same
  sharding rules as every parameter (B = 0: the model computes exactly what the base does). `salt`
  separates the adapters' initial A of different models drawn from one seed."""
  lora_lib.apply_lora(model, lora, nnx.Rngs(params=jax.random.fold_in(jax.random.key(seed), salt)))
  graphdef, adapters, base = nnx.split(model, lora_lib.LoraParam, ...)
  adapters = jax.device_put(adapters, sharding_lib.state_shardings(adapters, mesh))
  return graphdef, adapters, base


def num_params(state) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))
