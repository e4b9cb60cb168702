"""A training step's programs, built abstractly (no weights) on a target's mesh and lowered for it.

Everything a step holds lives here as ShapeDtypeStructs with the run's shardings: the trained AR
parameters and their optimizer state, the frozen rest of the generator, the DiT, VAE and glyph
encoder, and (full fine-tuning with KL) the reference copy. Each program is the very jitted function
the run calls (the sampler, the denoise + decode loop, the on-device rewards, the update), lowered
with arguments of the run's shapes: what compiles here is what the run compiles.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl import sharding as sharding_lib
from glmrl.errors import UserError
from glmrl.models import glm_image
from glmrl.models import lora as lora_lib
from glmrl.models.ar.model import GlmImageAR
from glmrl.models.ar.prompt import GenerationLayout
from glmrl.models.dit import GlmImageDiT
from glmrl.models.glyph import tokenize_glyph_texts
from glmrl.rewards import RewardComposer
from glmrl.rewards import registry as reward_registry
from glmrl.sampling import ar_sampler, decode, scheduler
from glmrl.train import decoder_step
from glmrl.train import optimizer as optimizer_lib
from glmrl.train import setup as setup_lib
from glmrl.train import step as step_lib


def placed(abstract_state, mesh):
  """`abstract_state` (ShapeDtypeStruct leaves) carrying the shardings the run's rules give it."""
  shardings = sharding_lib.state_shardings(abstract_state, mesh)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings)


def batch_array(mesh, shape, dtype, batch_axis: int = 0):
  """An abstract input with its batch axis over data x fsdp, as the pipeline places it."""
  spec = [None] * len(shape)
  spec[batch_axis] = sharding_lib.BATCH_AXES
  return jax.ShapeDtypeStruct(shape, dtype,
                              sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))


def replicated(mesh, shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


@dataclasses.dataclass
class AbstractDecoder:
  """The decoder policy's state (with "decoder" in config.train.policies), as the Trainer holds it."""
  graphdef: object
  trainable: nnx.State
  frozen: nnx.State
  opt_state: object
  reference: nnx.State | None
  tx: object
  schedule: object


@dataclasses.dataclass
class AbstractRun:
  """The run's state as shapes and shardings, and the static values its programs depend on."""
  config: object
  mesh: jax.sharding.Mesh
  configs: glm_image.GlmImageConfigs
  lora: lora_lib.LoraConfig
  layout: GenerationLayout
  ar_graphdef: object
  trainable: nnx.State
  frozen: nnx.State
  models: dict          # "dit", "vae", "glyph" -> (graphdef, abstract state)
  opt_state: object
  reference: nnx.State | None
  tx: object
  schedule: object
  decoder: AbstractDecoder | None = None

  @property
  def trains_ar(self) -> bool:
    return "ar" in self.config.train.policies.split("+")

  @property
  def batch_size(self) -> int:
    """Rows of the AR sampler and update: one per token grid."""
    return self.config.data.prompts_per_step * setup_lib.rollout_groups(self.config)[0]

  @property
  def images(self) -> int:
    """Images per rollout (the decoder's and the rewards' batch)."""
    ga, gd = setup_lib.rollout_groups(self.config)
    return self.config.data.prompts_per_step * ga * gd

  def dit_state(self):
    """The DiT's state as the decode loop takes it: the pipeline's, or the decoder policy's (trained, frozen)."""
    return self.models["dit"][1] if self.decoder is None else (self.decoder.trainable, self.decoder.frozen)

  @property
  def prompt_len(self) -> int:
    return self.config.data.max_prompt_tokens


def build(config, mesh) -> AbstractRun:
  """The run of `config` on `mesh`, abstractly: `model.checkpoint_dir`'s configs, else the preset's."""
  if config.data.mode != "t2i":
    raise UserError("--mode=compile covers text-to-image runs (config.data.mode='t2i'); image-to-image adds the "
                    "condition images' DiT cache, which it does not lower yet")
  configs = setup_lib.model_configs(config)
  lora = setup_lib.lora_config(config)

  def ar():
    model = GlmImageAR(configs.ar, rngs=nnx.Rngs(0))
    return lora_lib.apply_lora(model, lora, nnx.Rngs(0)) if lora.enabled else model

  ar_model = nnx.eval_shape(ar)
  trained_filter = lora_lib.LoraParam if lora.enabled else setup_lib.TRAINABLE
  graphdef, trainable, frozen = nnx.split(ar_model, trained_filter, ...)
  trainable, frozen = placed(trainable, mesh), placed(frozen, mesh)
  models = {}
  for name in ("dit", "vae", "glyph"):
    component_graphdef, state = glm_image.abstract_model(name, getattr(configs, name))
    models[name] = (component_graphdef, placed(state, mesh))
  tx, schedule = optimizer_lib.make_optimizer(config.optim, config.train.num_steps, config.grpo.num_iterations)
  opt_state = _optimizer_state(tx, trainable, mesh)
  reference = trainable if config.grpo.beta > 0 and not lora.enabled else None
  layout = GenerationLayout.for_size(config.data.height, config.data.width, text_to_image=True)
  decoder_state = None
  if "decoder" in config.train.policies.split("+"):
    decoder_state = _decoder(config, configs, mesh)
  return AbstractRun(config, mesh, configs, lora, layout, graphdef, trainable, frozen, models, opt_state,
                     reference, tx, schedule, decoder_state)


def _optimizer_state(tx, trainable, mesh):
  init = functools.partial(optimizer_lib.init, tx)
  abstract_opt = jax.eval_shape(init, trainable)
  opt_shardings = optimizer_lib.state_shardings(abstract_opt, trainable, mesh)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_opt, opt_shardings)


def _decoder(config, configs, mesh) -> AbstractDecoder:
  """The DiT split as `setup.decoder_parts` splits it (adapters or every parameter trained), abstractly."""
  c = config.decoder.lora
  lora = lora_lib.LoraConfig(rank=c.rank, alpha=float(c.alpha), targets=lora_lib.target_patterns(c.targets))

  def dit():
    model = GlmImageDiT(configs.dit, rngs=nnx.Rngs(0))
    return lora_lib.apply_lora(model, lora, nnx.Rngs(0)) if lora.enabled else model

  model = nnx.eval_shape(dit)
  graphdef, trainable, frozen = nnx.split(model, lora_lib.LoraParam if lora.enabled else nnx.Param, ...)
  trainable, frozen = placed(trainable, mesh), placed(frozen, mesh)
  tx, schedule = optimizer_lib.make_optimizer(config.decoder.optim, config.train.num_steps,
                                              config.decoder.num_iterations)
  reference = trainable if config.decoder.beta > 0 and not lora.enabled else None
  return AbstractDecoder(graphdef, trainable, frozen, _optimizer_state(tx, trainable, mesh), reference, tx, schedule)


@dataclasses.dataclass(frozen=True)
class Program:
  """One program of the step: its lowering and which of its arguments are resident state."""
  name: str
  lowered: object
  state_args: tuple  # the trees among its arguments that live in HBM for the whole run


def sampler(run: AbstractRun) -> Program:
  """The AR sampler: prefill and the KV-cache decode loop of every generated token."""
  mesh, b, l, n = run.mesh, run.batch_size, run.prompt_len, run.layout.num_new_tokens
  state = nnx.merge_state(run.trainable, run.frozen)
  key = jax.ShapeDtypeStruct((b,), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                             sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
                                 sharding_lib.BATCH_AXES)))
  lowered = ar_sampler._sample_ids.lower(  # pylint: disable=protected-access  # the run's own jitted sampler
      run.ar_graphdef, state, batch_array(mesh, (b, l), jnp.int32), batch_array(mesh, (b, l), jnp.bool_),
      batch_array(mesh, (3, b, l), jnp.int32, batch_axis=1), batch_array(mesh, (b, 3, n), jnp.int32), key,
      layout=run.layout, cfg=setup_lib.sampling_config(run.config))
  return Program("ar_sampler", lowered, (run.trainable, run.frozen))


def _negative_glyph_len() -> int:
  """Glyph tokens of the empty prompt, as the pipeline pads them (its unconditional branch)."""
  from transformers import ByT5Tokenizer

  return int(tokenize_glyph_texts([""], ByT5Tokenizer()).gather_mask.shape[1])


def _conditioning(run: AbstractRun, rows: int) -> decode.Conditioning:
  cfg, mesh, configs = run.config, run.mesh, run.configs
  h, w, dtype = cfg.data.height, cfg.data.width, configs.glyph.dtype
  glyph_len, neg_len, d = cfg.data.max_glyph_tokens, _negative_glyph_len(), configs.glyph.d_model
  return decode.Conditioning(
      prior_ids_BxX=batch_array(mesh, (rows, (h // 16) * (w // 16)), jnp.int32),
      glyph_BxSxD=batch_array(mesh, (rows, glyph_len, d), dtype),
      glyph_mask_BxS=batch_array(mesh, (rows, glyph_len), jnp.bool_),
      neg_glyph_BxSxD=batch_array(mesh, (rows, neg_len, d), dtype),
      neg_glyph_mask_BxS=batch_array(mesh, (rows, neg_len), jnp.bool_))


def _latent_shape(run: AbstractRun) -> tuple:
  f = run.configs.vae.scale_factor
  return (run.configs.dit.in_channels, run.config.data.height // f, run.config.data.width // f)


def rollout_steps(run: AbstractRun) -> int:
  """Denoising steps of a training rollout: decoder.train_steps when the decoder trains, else sampling.dit_steps."""
  return run.config.decoder.train_steps if run.decoder is not None else run.config.sampling.dit_steps


def decoder(run: AbstractRun) -> Program:
  """The DiT denoising loop (both CFG branches every step) and the VAE decode, on one decode chunk; with the
  decoder policy, the training rollout's: its steps, its SDE window (recorded) and the trained DiT."""
  cfg, mesh, configs = run.config, run.mesh, run.configs
  chunk = cfg.sampling.decode_batch or run.images
  h, w = cfg.data.height, cfg.data.width
  sched = scheduler.glm_image_schedule(rollout_steps(run), h, w, configs.scheduler,
                                       vae_scale_factor=configs.vae.scale_factor, patch_size=configs.dit.patch_size)
  dit_def = run.models["dit"][0] if run.decoder is None else run.decoder.graphdef
  dit_state = run.dit_state()
  vae_def, vae_state = run.models["vae"]
  sde = ()
  if run.decoder is not None:
    key = jax.ShapeDtypeStruct((chunk,), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                               sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
                                   sharding_lib.BATCH_AXES)))
    sde = (decode.SdeWindow(float(cfg.decoder.noise_level), cfg.decoder.window_size), key,
           replicated(mesh, (), jnp.int32))
  lowered = decode.denoise_and_decode.lower(
      dit_def, dit_state, vae_def, vae_state, _conditioning(run, chunk),
      batch_array(mesh, (chunk, *_latent_shape(run)), jnp.float32),
      replicated(mesh, sched.model_timesteps.shape, jnp.float32), replicated(mesh, sched.sigmas.shape, jnp.float32),
      float(cfg.sampling.guidance_scale), batch_array(mesh, (chunk, 2), jnp.float32),
      batch_array(mesh, (chunk, 2), jnp.float32), None, *sde)
  return Program("decoder", lowered, (dit_state, vae_state))


def rewards(run: AbstractRun, which: str = "rewards") -> Program | str:
  """The on-device scoring (pure-JAX rewards, the weighted sum) of a batch by config.rewards (or, `which`
  "decoder_rewards", config.decoder.rewards); a reason string when the configured rewards cannot be built
  abstractly (model-backed ones load weights from disk)."""
  cfg, mesh, b = run.config, run.mesh, run.images
  config_entries = cfg.decoder.rewards if which == "decoder_rewards" else cfg.rewards
  entries = [dict(e.to_dict() if hasattr(e, "to_dict") else e) for e in config_entries]
  backed = [e["name"] for e in entries if reward_registry.get(e["name"]).model_backed]
  if backed:
    return (f"rewards built by factories {backed} need what their kwargs name (weights on disk, a server); "
            "not compiled here")
  composer = RewardComposer(entries, group_size=cfg.grpo.group_size, std_eps=cfg.grpo.std_eps)
  host = {e["name"]: batch_array(mesh, (b,), jnp.float32) for e in composer.entries if not e["reward"].pure_jax}
  images = batch_array(mesh, (b, cfg.data.height, cfg.data.width, 3), jnp.uint8)
  lowered = composer._device_scores_jit.lower(host, images, {})  # pylint: disable=protected-access
  return Program(which, lowered, ())


def update(run: AbstractRun) -> Program:
  """The GRPO update: teacher-forced log-probs (old and reference on the first iteration), the loss,
  its gradient accumulated over micro-batches, AdamW (with master weights for bfloat16 parameters)."""
  mesh, b, l, n = run.mesh, run.batch_size, run.prompt_len, run.layout.num_new_tokens
  spec = setup_lib.update_spec(run.config, l, run.layout)
  shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
  fn = step_lib.make_update(run.ar_graphdef, spec, run.tx, run.schedule, param_shardings=shardings(run.trainable),
                            opt_shardings=shardings(run.opt_state))
  per_token = lambda dtype=jnp.float32: batch_array(mesh, (b, n), dtype)
  rollout = step_lib.Rollout(
      sequence_ids=batch_array(mesh, (b, l + n), jnp.int32),
      positions=batch_array(mesh, (3, b, l + n), jnp.int32, batch_axis=1),
      valid=batch_array(mesh, (b, l + n), jnp.bool_), sampler_logp=per_token(), old_logp=per_token(),
      advantages=batch_array(mesh, (b,), jnp.float32), mask=per_token(),
      ref_logp=per_token() if run.config.grpo.beta > 0 else None)
  lowered = fn.lower(run.trainable, run.frozen, run.opt_state, rollout, run.reference,
                     replicated(mesh, (), jnp.bool_))
  state = (run.trainable, run.frozen, run.opt_state) + ((run.reference,) if run.reference is not None else ())
  return Program("update", lowered, state)


def decoder_update(run: AbstractRun) -> Program:
  """The decoder policy's update: per trained step of the SDE window, the guided forward of the trained DiT
  (and, with decoder.beta > 0, of its reference), the Flow-GRPO loss and its gradient accumulated over
  micro-batches x steps, AdamW."""
  mesh, b, d = run.mesh, run.images, run.decoder
  steps = run.config.decoder.window_size
  shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
  fn = decoder_step.make_update(d.graphdef, setup_lib.decoder_spec(run.config), d.tx, d.schedule,
                                param_shardings=shardings(d.trainable), opt_shardings=shardings(d.opt_state))
  per_step = batch_array(mesh, (b, steps), jnp.float32)
  latents = batch_array(mesh, (b, steps, *_latent_shape(run)), jnp.float32)
  rollout = decoder_step.DecoderRollout(
      cond=_conditioning(run, b), target_size=batch_array(mesh, (b, 2), jnp.float32),
      crop=batch_array(mesh, (b, 2), jnp.float32), latents_before=latents, latents_after=latents,
      sampler_logp=per_step, old_logp=per_step, advantages=batch_array(mesh, (b,), jnp.float32), mask=per_step)
  window = decoder_step.Window(*(replicated(mesh, (steps,), jnp.float32) for _ in range(3)))
  lowered = fn.lower(d.trainable, d.frozen, d.opt_state, rollout, window, d.reference, replicated(mesh, (), jnp.bool_))
  state = (d.trainable, d.frozen, d.opt_state) + ((d.reference,) if d.reference is not None else ())
  return Program("decoder_update", lowered, state)


def builders(run: AbstractRun) -> dict:
  """The programs of the run's step, by name: the AR ones when it trains the AR policy, the decoder's when it
  trains the decoder (the sampler and the decode loop always run)."""
  out = {"ar_sampler": sampler, "decoder": decoder}
  if run.trains_ar:
    out.update(rewards=rewards, update=update)
  if run.decoder is not None:
    out.update(decoder_rewards=functools.partial(rewards, which="decoder_rewards"), decoder_update=decoder_update)
  return out


def num_params(tree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


def decoder_params(run: AbstractRun) -> int:
  """Base parameters each generated token's forward multiplies by: the text decoder and the head
  (not the vision encoder or VQ, which only tokenize condition images; not LoRA's small adapters)."""
  state = nnx.merge_state(run.trainable, run.frozen)
  return int(sum(np.prod(v.shape) for path, v in nnx.to_flat_state(state)
                 if str(path[0]) in ("text", "lm_head") and not isinstance(v, lora_lib.LoraParam)))
