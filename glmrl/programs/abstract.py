"""A training step's programs, built abstractly (no weights) on a target's mesh and lowered for it.

Everything a step holds is here as ShapeDtypeStructs with the run's shardings: the models, and each
trained policy's state (trained and frozen parts, optimizer state, reference) built by the run's own
`build_state`. Each program is the very jitted function the run calls (the sampler, the denoise + decode
loop, the on-device rewards, each policy's update), lowered with arguments of the run's shapes: what
compiles here is what the run compiles.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl import sharding as sharding_lib
from glmrl.programs import plan as plan_lib
from glmrl.programs import report as report_lib
from glmrl.programs import topology
from glmrl.models import glm_image
from glmrl.models import lora as lora_lib
from glmrl.models.ar.prompt import GenerationLayout
from glmrl.models.glyph import tokenize_glyph_texts
from glmrl.policy import registry
from glmrl.policy.state import build_state, placed
from glmrl.rewards import RewardComposer
from glmrl.rewards import compose as compose_lib
from glmrl.rewards import registry as reward_registry
from glmrl.sampling import ar_sampler, decode, pipeline, rollout_weights, scheduler
from glmrl.sampling.logprobs import sampling_config


def batch_array(mesh, shape, dtype, batch_axis: int = 0):
  """An abstract input with its batch axis over data x fsdp, as the pipeline places it."""
  spec = [None] * len(shape)
  spec[batch_axis] = sharding_lib.BATCH_AXES
  return jax.ShapeDtypeStruct(shape, dtype,
                              sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))


def replicated(mesh, shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


@dataclasses.dataclass
class AbstractRun(plan_lib.PlanView):
  """The run's state as shapes and shardings, and the static values its programs depend on (its `plan`). `states`:
  the trained policies' states, built by the run's own `glmrl.policy.state.build_state`."""
  plan: plan_lib.RunPlan
  mesh: jax.sharding.Mesh
  layout: GenerationLayout
  models: dict          # component -> (graphdef, abstract state) as loaded (the trained ones before their split)
  states: dict          # policy name -> PolicyState (abstract)

  def batch_array(self, shape, dtype, batch_axis: int = 0):
    return batch_array(self.mesh, shape, dtype, batch_axis)

  def replicated(self, shape, dtype):
    return replicated(self.mesh, shape, dtype)

  def batch_keys(self, rows: int):
    """[rows] PRNG keys over the batch axes."""
    return jax.ShapeDtypeStruct((rows,), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                                sharding=jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(
                                    sharding_lib.BATCH_AXES)))

  def abstract_conditioning(self, rows: int) -> decode.Conditioning:
    """The DiT conditioning of `rows` images, as the pipeline pads it."""
    cfg, configs = self.config, self.configs
    h, w, dtype = cfg.data.height, cfg.data.width, configs.glyph.dtype
    glyph_len, neg_len, d = cfg.data.max_glyph_tokens, _negative_glyph_len(), configs.glyph.d_model
    return decode.Conditioning(
        prior_ids_BxX=self.batch_array((rows, (h // 16) * (w // 16)), jnp.int32),
        glyph_BxSxD=self.batch_array((rows, glyph_len, d), dtype),
        glyph_mask_BxS=self.batch_array((rows, glyph_len), jnp.bool_),
        neg_glyph_BxSxD=self.batch_array((rows, neg_len, d), dtype),
        neg_glyph_mask_BxS=self.batch_array((rows, neg_len), jnp.bool_))

  @property
  def batch_size(self) -> int:
    """Rows of the AR sampler and update: one per token grid."""
    return self.config.data.prompts_per_step * self.request.grids_per_prompt

  @property
  def images(self) -> int:
    """Images per rollout (the decoder's and the rewards' batch)."""
    return self.config.data.prompts_per_step * self.request.images_per_prompt

  def component(self, name: str) -> tuple:
    """(graphdef, states) of a pipeline model as the run's programs take it: its trained policy's
    (trainable, frozen), or its own state alone."""
    for state in self.states.values():
      if state.policy.component == name:
        return state.graphdef, state.model_params()
    graphdef, state = self.models[name]
    return graphdef, (state,)

  @property
  def prompt_len(self) -> int:
    return self.config.data.max_prompt_tokens

  @property
  def latent_shape(self) -> tuple[int, int, int]:
    return self.configs.latent_shape(self.config.data.height, self.config.data.width)

  def trained(self) -> tuple:
    """The trees the run trains: each policy's trained state."""
    return tuple(state.trainable for state in self.states.values())

  @functools.cached_property
  def reward_models(self) -> dict:
    """{policy: {reward name: (AbstractReward, graphdef, state)}}: each trained policy's model-backed rewards that
    can be built abstractly (`Reward.abstract`), their parameters replicated on the mesh as the run loads them
    (`train.setup.reward_composer`). A reward in several policies' lists is one model, as the run's cache keeps it."""
    out, built = {}, {}
    for name, policy in self.policies.items():
      out[name] = {}
      for entry in compose_lib.config_entries(policy.rewards(self.request)[0]):
        reward = reward_registry.get(entry["name"])
        if reward.abstract is None:
          continue
        kwargs = dict(entry.get("kwargs") or {})
        key = (entry["name"], repr(sorted(kwargs.items())))
        if key not in built:
          spec = reward.abstract(**kwargs)
          graphdef, state = nnx.split(spec.module)
          built[key] = (spec, graphdef, placed_replicated(state, self.mesh))
        out[name][entry["name"]] = built[key]
    return out

  def resident_bytes(self) -> dict:
    """Bytes per chip of what stays in HBM for the whole run, by kind. `frozen`: every model's part that no
    policy trains (a trained model's base, the other models whole); `ema`: the moving averages kept."""
    states = self.states.values()
    trained_models = {s.policy.component for s in states}
    frozen = tuple(s.frozen for s in states) + tuple(state for name, (_, state) in self.models.items()
                                                     if name not in trained_models)
    averages = tuple(s.ema for s in states if s.ema is not None)
    out = {
        "params": report_lib.bytes_per_chip(self.trained()),
        "opt_state": report_lib.bytes_per_chip(tuple(s.opt_state for s in states)),
        "frozen": report_lib.bytes_per_chip(frozen),
        "reference": report_lib.bytes_per_chip(tuple(s.reference for s in states if s.reference is not None)),
    }
    if averages:
      out["ema"] = report_lib.bytes_per_chip(averages)
    # One entry per reward model (`reward:<name>`), each counted once however many policies score with it.
    models = {id(m[2]): (name, m[2]) for by_name in self.reward_models.values() for name, m in by_name.items()}
    for name, state in models.values():
      out[f"reward:{name}"] = out.get(f"reward:{name}", 0) + report_lib.bytes_per_chip(state)
    return out


def build(config, mesh, platform: str = "tpu", hbm_bytes: int | None = None) -> AbstractRun:
  """The run of `config` on `mesh` of `platform` chips, abstractly: `model.checkpoint_dir`'s configs, else the
  preset's; its plan (`glmrl.programs.plan.make`) with every `auto` resolved for chips of `hbm_bytes` (default: the
  slice's, from the mesh's devices), the choices in `run.choices`."""
  drafted = []  # the draft's abstract run, where a choice needed its sizes

  def sizes(draft: plan_lib.RunPlan) -> AbstractRun:
    drafted.append(from_plan(draft, mesh))
    return drafted[0]

  plan = plan_lib.make(config, mesh, hbm_bytes or topology.chip_of(mesh).hbm_bytes, sizes, platform)
  # The draft's states serve the plan: `auto` chooses the sampler's weight layout and the DiT's attention kernel,
  # which the draft's model configs already hold for its platform (`plan.model_configs`).
  return dataclasses.replace(drafted[0], plan=plan) if drafted else from_plan(plan, mesh)


def from_plan(plan: plan_lib.RunPlan, mesh) -> AbstractRun:
  """The abstract run of `plan` on `mesh`: every model's abstract state placed as the run places it, each trained
  policy's state built by the run's own `build_state`."""
  models = {}
  for name in glm_image.COMPONENTS:
    graphdef, state = glm_image.abstract_model(name, getattr(plan.configs, name))
    models[name] = (graphdef, placed(state, mesh))
  states = {name: build_state(policy, plan.config, models[policy.component], mesh, abstract=True)
            for name, policy in plan.policies.items()}
  layout = GenerationLayout.for_size(plan.config.data.height, plan.config.data.width, text_to_image=True)
  return AbstractRun(plan, mesh, layout, models, states)


@dataclasses.dataclass(frozen=True)
class Program:
  """One program of the step: its lowering (a tuple: consecutive programs, run as one step of the step) and which
  of its arguments are resident state."""
  name: str
  lowered: object
  state_args: tuple  # the trees among its arguments that live in HBM for the whole run
  calls: int = 1     # times a step runs it (the decoder: once per decode chunk)


def ar_reshard(run: AbstractRun) -> Program:
  """config.rollout.ar_weights "gathered": the once-per-rollout cast and reshard of the generator's states
  (`rollout_weights.Reshard`'s consecutive parts, as `GlmImagePipeline.rollout_ar_params` runs them)."""
  _, states = run.component("ar")
  return Program("ar_reshard", rollout_weights.Reshard(states, run.configs.ar.dtype).lower(states), states)


def sampler(run: AbstractRun) -> Program:
  """The AR sampler: prefill and the KV-cache decode loop of every generated token, reading the weights in the
  run's rollout layout (config.rollout.ar_weights: the resident FSDP states, or their gathered copy)."""
  mesh, b, l, n = run.mesh, run.batch_size, run.prompt_len, run.layout.num_new_tokens
  graphdef, states = run.component("ar")
  resident = states
  if run.config.rollout.ar_weights == "gathered":
    states, resident = rollout_weights.abstract(states, run.configs.ar.dtype), ()  # lives for the rollout only
  key = jax.ShapeDtypeStruct((b,), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                             sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
                                 sharding_lib.BATCH_AXES)))
  lowered = ar_sampler._sample_ids.lower(  # pylint: disable=protected-access  # the run's own jitted sampler
      graphdef, nnx.merge_state(*states), batch_array(mesh, (b, l), jnp.int32), batch_array(mesh, (b, l), jnp.bool_),
      batch_array(mesh, (3, b, l), jnp.int32, batch_axis=1), batch_array(mesh, (b, 3, n), jnp.int32), key,
      layout=run.layout, cfg=sampling_config(run.config.sampling))
  return Program("ar_sampler", lowered, resident)


def _negative_glyph_len() -> int:
  """Glyph tokens of the empty prompt, as the pipeline pads them (its unconditional branch)."""
  from transformers import ByT5Tokenizer

  return int(tokenize_glyph_texts([""], ByT5Tokenizer()).gather_mask.shape[1])


def rollout_steps(run: AbstractRun) -> int:
  """Denoising steps of a training rollout: the decoding policy's (`registry.decoding`), else sampling.dit_steps."""
  leg = registry.decoding(run.policies)
  return leg.train_steps if leg is not None else run.config.sampling.dit_steps


def decoder(run: AbstractRun) -> Program:
  """The DiT denoising loop (both CFG branches every step) and the VAE decode, on one decode chunk; with a DiT
  policy, its rollout leg's: its steps and guidance, what its leg adds (Flow-GRPO's SDE window) and the trained
  DiT."""
  cfg, mesh, configs = run.config, run.mesh, run.configs
  chunk = pipeline.decode_chunk(cfg.sampling.decode_batch, run.images, run.request.images_per_prompt,
                                sharding_lib.batch_devices(mesh))
  h, w = cfg.data.height, cfg.data.width
  sched = scheduler.glm_image_schedule(rollout_steps(run), h, w, configs.scheduler,
                                       vae_scale_factor=configs.vae.scale_factor, patch_size=configs.dit.patch_size)
  dit_def, dit_states = run.component("dit")
  dit_state = dit_states if len(dit_states) > 1 else dit_states[0]
  vae_def, vae_state = run.models["vae"]
  leg = registry.decoding(run.policies)
  lowered = decode.denoise_and_decode.lower(
      dit_def, dit_state, vae_def, vae_state, run.abstract_conditioning(chunk),
      batch_array(mesh, (chunk, *run.latent_shape), jnp.float32),
      replicated(mesh, sched.model_timesteps.shape, jnp.float32), replicated(mesh, sched.sigmas.shape, jnp.float32),
      leg.guidance if leg is not None else float(cfg.sampling.guidance_scale),
      batch_array(mesh, (chunk, 2), jnp.float32),
      batch_array(mesh, (chunk, 2), jnp.float32), None, *(leg.abstract_leg(run, chunk) if leg is not None else ()))
  return Program("decoder", lowered, (dit_state, vae_state), calls=run.images // chunk)


def placed_replicated(state, mesh):
  """`state`'s shapes replicated on `mesh` (where the run loads a reward model's weights)."""
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)


def rewards(run: AbstractRun, policy: str) -> Program | str:
  """The on-device scoring of a batch by `policy`'s rewards: the pure-JAX rewards (a model-backed one on its
  model's abstract parameters, `AbstractRun.reward_models`), the host rewards' scores as inputs, the weighted
  sum; a reason string when a model-backed reward cannot be built abstractly (a server, or no `abstract`)."""
  cfg, mesh, b = run.config, run.mesh, run.images
  trained = run.policies[policy]
  config_entries, group = trained.rewards(run.request)
  entries = compose_lib.config_entries(config_entries, cfg.normalize_rewards_per_group)
  models = run.reward_models[policy]
  backed = [e["name"] for e in entries if reward_registry.get(e["name"]).model_backed]
  unbuilt = [name for name in backed if name not in models]
  if unbuilt:
    return (f"rewards built by factories {unbuilt} need what their kwargs name (weights on disk, a server); "
            "not compiled here")
  plain = [e for e in entries if e["name"] not in models]
  composer = RewardComposer(plain, group_size=group, std_eps=cfg.grpo.std_eps) if plain else None
  host = {e["name"]: batch_array(mesh, (b,), jnp.float32) for e in (composer.entries if composer else ())
          if not e["reward"].pure_jax}
  images = batch_array(mesh, (b, cfg.data.height, cfg.data.width, 3), jnp.uint8)
  metadata = {key: batch_array(mesh, (b, *shape), dtype) for spec, _, _ in models.values()
              for key, (shape, dtype) in spec.prepared.items()}
  states = {name: state for name, (_, _, state) in models.items()}

  @jax.jit
  def score(states, host, images, metadata):
    components = dict(host)
    if composer is not None:
      components.update(composer.jax_scores(images, metadata))
    for name, (spec, graphdef, _) in models.items():
      components[name] = spec.make(nnx.merge(graphdef, states[name])).fn(images, None, metadata)
    return compose_lib.weighted_total(entries, components, group, cfg.grpo.std_eps), components

  return Program(trained.programs[0], score.lower(states, host, images, metadata), (states,))


def update(run: AbstractRun, policy: str) -> Program:
  """A policy's update as the run compiles it (`Policy.make_update` on the abstract state): the AR's
  teacher-forced log-probs, or the decoder's guided forward per trained step; the loss, its gradient
  accumulated over micro-batches (x steps), AdamW (with master weights for bfloat16 parameters)."""
  state, trained = run.states[policy], run.policies[policy]
  shape, batch = trained.abstract_inputs(run)
  fn = trained.make_update(state, shape)
  lowered = fn.lower(state.trainable, state.frozen, state.opt_state, batch, trained.anchors(state),
                     replicated(run.mesh, (), jnp.bool_))
  resident = (state.trainable, state.frozen, state.opt_state) + tuple(
      x for x in (state.reference, state.ema) if x is not None)
  return Program(trained.programs[1], lowered, resident)


def builders(run: AbstractRun) -> dict:
  """The programs of the run's step, by name: the sampler (after its weights' reshard under the "gathered"
  rollout layout) and the decode loop always, then each trained policy's rewards and update."""
  out = {"ar_reshard": ar_reshard} if run.config.rollout.ar_weights == "gathered" else {}
  out.update({"ar_sampler": sampler, "decoder": decoder})
  for name, policy in run.policies.items():
    rewards_name, update_name = policy.programs
    out[rewards_name] = functools.partial(rewards, policy=name)
    out[update_name] = functools.partial(update, policy=name)
  return out


def num_params(tree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


def generator_params(run: AbstractRun) -> int:
  """Base parameters each generated token's forward multiplies by: the generator's text decoder and the head
  (not the vision encoder or VQ, which only tokenize condition images; not LoRA's small adapters)."""
  _, states = run.component("ar")
  state = nnx.merge_state(*states)
  return int(sum(np.prod(v.shape) for path, v in nnx.to_flat_state(state)
                 if str(path[0]) in ("text", "lm_head") and not isinstance(v, lora_lib.LoraParam)))
