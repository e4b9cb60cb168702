"""Everything a run needs, built from the config: mesh, data, models, pipeline, rewards, the policies' states.

Every check on the inputs happens here, before any model is built or compiled.
"""

from __future__ import annotations

import dataclasses
import os

import jax
from absl import logging

from glmrl.runtime import agreement
from glmrl.runtime import device_memory, distributed
from glmrl import sharding as sharding_lib
from glmrl.programs import abstract, auto
from glmrl.programs import plan as plan_lib
from glmrl.data import PromptIterator, benchmarks, load_prompts
from glmrl.checkpoint.manager import check_space
from glmrl.errors import UserError
from glmrl.logging import wandb_run
from glmrl.models import glm_image
from glmrl.models.ar import tokenizer as word_tokenizer
from glmrl.models.ar.prompt import PromptProcessor
from glmrl.policy.state import build_state, num_params
from glmrl.rewards import RewardComposer
from glmrl.rewards import compose as compose_lib
from glmrl.rewards import registry as reward_registry
from glmrl.sampling.logprobs import sampling_config
from glmrl.sampling.pipeline import GlmImagePipeline, PipelineSpec, check_glyph_fits


@dataclasses.dataclass
class Run(plan_lib.PlanView):
  """What every mode builds from the config: mesh, prompts, rewards, pipeline, and the state of each trained
  policy by name (`glmrl.policy`), from the run's one plan (`glmrl.programs.plan.RunPlan`)."""
  plan: plan_lib.RunPlan
  mesh: jax.sharding.Mesh
  records: list
  eval_records: list
  iterator: PromptIterator
  composer: RewardComposer  # config.rewards: the AR policy's, and what evaluation reports
  composers: dict           # policy name -> its RewardComposer
  pipeline: GlmImagePipeline
  states: dict              # policy name -> PolicyState

  @property
  def group_size(self) -> int:
    """Samples per prompt of evaluation and generation."""
    return self.config.grpo.group_size

  @property
  def batch_size(self) -> int:
    """Images per rollout."""
    return self.config.data.prompts_per_step * self.request.images_per_prompt

  def sampling_params(self, trainables: dict | None = None) -> dict:
    """The pipeline's parameters for the trained states `trainables` (policy name -> trained state; default
    the states' own): `ar_params` and `dit_params` of the models the run trains (None: the pipeline's own)."""
    out = {"ar_params": None, "dit_params": None}
    for name, state in self.states.items():
      trainable = None if trainables is None else trainables[name]
      out[f"{state.policy.component}_params"] = state.model_params(trainable)
    return out


def pipeline_spec(config) -> PipelineSpec:
  return PipelineSpec(height=config.data.height, width=config.data.width,
                      sampling=sampling_config(config.sampling),
                      dit_steps=config.sampling.dit_steps, guidance_scale=float(config.sampling.guidance_scale),
                      share_noise_in_group=config.sampling.share_noise_in_group,
                      prompt_pad=config.data.max_prompt_tokens, glyph_pad=config.data.max_glyph_tokens,
                      glyph_texts=config.data.max_glyph_texts, decode_batch=config.sampling.decode_batch,
                      ar_weights=config.rollout.ar_weights)


def eval_source(config) -> str:
  """The file the held-out prompts come from (for messages): the benchmark's, or config.eval.prompts_file."""
  if config.eval.benchmark:
    return benchmarks.path(benchmarks.parse(config.eval.benchmark)[0])
  return config.eval.prompts_file


def load_records(plan: plan_lib.RunPlan, train: bool = True):
  """(training prompts, held-out prompts) of the plan's config, each checked against the mode and what the rewards
  read."""
  config = plan.config
  records = load_prompts(config.data.prompts_file)
  eval_records = load_prompts(config.eval.prompts_file) if config.eval.prompts_file else []
  eval_path = eval_source(config)
  if config.eval.benchmark:
    eval_records = benchmarks.load(config.eval.benchmark, config.eval.seed)
  if config.eval.max_prompts:
    eval_records = benchmarks.subset(eval_records, min(config.eval.max_prompts, len(eval_records)),
                                     config.eval.seed, f"config.eval.max_prompts={config.eval.max_prompts}")
  for path, recs in ((config.data.prompts_file, records), (eval_path, eval_records)):
    for r in recs:
      if config.data.mode == "i2i" and not r.source_images:
        raise UserError(f"{path}:{r.line}: data.mode='i2i' needs source_images on every line")
      if config.data.mode == "t2i" and r.source_images:
        raise UserError(f"{path}:{r.line}: source_images given but data.mode='t2i' (set --config.data.mode=i2i)")
  # What the rewards read of every prompt: the trained policies' rewards score the training prompts (when the run
  # trains), and evaluation adds config.rewards.
  trained_entries = [e for p in plan.policies.values() for e in p.rewards(plan.request)[0]]
  for path, recs, entries in ((config.data.prompts_file, records, trained_entries if train else []),
                              (eval_path, eval_records, list(config.rewards) + trained_entries)):
    for entry in entries:
      for key in reward_registry.get(entry["name"]).needs:
        lacking = [r for r in recs if not (r.target_image if key == "target_image" else key in r.metadata)]
        if lacking:
          field = f'"{key}": ...' if key == "target_image" else f'"metadata": {{"{key}": ...}}'
          raise UserError(f"{path}:{lacking[0].line}: reward {entry['name']!r} needs {key!r} on every prompt "
                          f"(a .jsonl line with {field}; {len(lacking)} of {len(recs)} prompts lack it)")
  return records, eval_records


def device_memory_bytes() -> int:
  """The device memory a run's `auto` choices fit (`make_plan`): the smallest any process reports. One choice for
  every process (hosts of one run can report different sizes), as two processes that built different programs
  would wait on each other's collectives for ever."""
  return distributed.smallest("device memory", device_memory.limit_bytes())


def make_plan(config, mesh, hbm_bytes: int) -> plan_lib.RunPlan:
  """The run's plan on `mesh` of devices of `hbm_bytes` each (`glmrl.programs.plan.make`), each `auto` choice
  logged in one line by process 0; UserError when the run's resident state cannot fit a device at all."""

  def sizes(draft: plan_lib.RunPlan) -> abstract.AbstractRun:
    run = abstract.from_plan(draft, mesh)
    auto.check_resident_fits(run, hbm_bytes)
    return run

  plan = plan_lib.make(config, mesh, hbm_bytes, sizes)
  for choice in plan.choices if distributed.is_main() else ():
    logging.info("%s", choice.line())
  return plan


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
  entries = compose_lib.config_entries(rewards or config.rewards, config.normalize_rewards_per_group)
  return RewardComposer(entries, group_size=group_size or config.grpo.group_size, std_eps=config.grpo.std_eps,
                        sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


MAX_CHARS_PER_TOKEN = 32


def check_prompt_lengths(processor, records, path, config) -> None:
  """Every text-to-image prompt must fit the fixed prompt length (one compilation per run).

  Image-to-image prompts are checked when their images are tokenized (`GlmImagePipeline.prepare`).
  """
  limit = config.data.max_prompt_tokens
  # Characters first: a tokenizer built from the prompts' own words (the demo's) reads any word as one token.
  # Byte-level BPE tokenizers take about 4 characters of English per token; more than MAX_CHARS_PER_TOKEN times
  # the budget cannot fit any real one.
  long_chars = [r for r in records if len(r.prompt) > limit * MAX_CHARS_PER_TOKEN]
  if long_chars:
    r = long_chars[0]
    raise UserError(f"{path}:{r.line}: the prompt has {len(r.prompt)} characters, more than "
                    f"config.data.max_prompt_tokens={limit} tokens can hold ({MAX_CHARS_PER_TOKEN} characters "
                    f"per token at most)")
  lengths = [(processor([r.prompt], config.data.height, config.data.width).input_ids.shape[1], r.line)
             for r in records if not r.source_images]
  too_long = [(n, line) for n, line in lengths if n > limit]
  if too_long:
    n, line = too_long[0]
    raise UserError(f"{path}:{line}: the prompt takes {n} tokens with its grids, more than "
                    f"config.data.max_prompt_tokens={limit} ({len(too_long)} prompt(s) too long; the longest "
                    f"needs --config.data.max_prompt_tokens={max(n for n, _ in too_long)})")


def build(config, *, train: bool = False, workdir: str | None = None, logs: bool = False,
          resume_data: dict | None = None) -> Run:
  """Checks inputs, then builds the mesh, data, rewards, models, pipeline and the trained policies' states
  (`train`: with their optimizers and references, the disk of `workdir` checked to hold one checkpoint of them;
  `logs`: the run logs, so W&B's login is checked where config.log.wandb asks for it; `resume_data`: the prompt
  iterator's state in the checkpoint the run resumes from, checked against the prompts first)."""
  # Each part checks this process's view (its prompt files, the reward servers it reaches, its disk); every process
  # refuses together (glmrl.runtime.agreement) before any model is built. The memory the plan fits is exchanged
  # before.
  hbm_bytes = device_memory_bytes()
  plan, mesh, records, eval_records = agreement.checked(lambda: _checked_plan(config, hbm_bytes, train))
  composers, composer, processor, glyph_tokenizer, iterator = agreement.checked(
      lambda: _checked_inputs(plan, mesh, records, eval_records, resume_data, train and workdir, logs))
  config, policies, configs = plan.config, plan.policies, plan.configs
  logging.info("mesh %s on %d devices", dict(mesh.shape), jax.device_count())
  source = config.model.checkpoint_dir or f"a random {config.model.preset!r} preset"
  models = {}
  for i, name in enumerate(glm_image.COMPONENTS):
    logging.info("loading %s from %s", name, source)
    models[name] = glm_image.build(name, getattr(configs, name), mesh=mesh,
                                   checkpoint_dir=config.model.checkpoint_dir, seed=config.seed + i)
  states = {}
  for name, policy in policies.items():
    states[name] = state = build_state(policy, config, models[policy.component], mesh, train=train)
    logging.info("policy %s: %d trained parameters (frozen: %d)", name, num_params(state.trainable),
                 num_params(state.frozen))
    # The run owns the trained parameters (the update donates them); the pipeline gets them per call.
    models[policy.component] = (state.graphdef, None)
  pipeline = GlmImagePipeline(configs, models, processor, glyph_tokenizer, pipeline_spec(config), mesh=mesh)
  distributed.barrier("models built")  # before the run's first collective (`distributed.barrier`)
  return Run(plan, mesh, records, eval_records, iterator, composer, composers, pipeline, states)


def _checked_plan(config, hbm_bytes: int, train: bool):
  """(the run's plan, its mesh, training records, held-out records): the mesh's shape, the plan, the prompt files."""
  m = config.mesh
  try:
    mesh = sharding_lib.make_mesh(m.data, m.fsdp, m.tensor)
  except ValueError as e:
    raise UserError(f"config.mesh: {e}") from None
  plan = make_plan(config, mesh, hbm_bytes)
  return (plan, mesh, *load_records(plan, train))


def _checked_inputs(plan, mesh, records, eval_records, resume_data, checkpoints_in: str | None, logs: bool):
  """(each policy's reward composer, evaluation's, processor, glyph tokenizer, prompt iterator): W&B's login where
  the run `logs` to it, the rewards built (servers probed), every prompt checked against the tokenizers, the
  checkpoint's prompt order against the file, the disk of `checkpoints_in` against one checkpoint."""
  config, policies, request = plan.config, plan.policies, plan.request
  if logs and config.log.wandb and distributed.is_main():  # process 0 logs
    wandb_run.check_login(config.log.wandb_mode)
  composers = {}
  for name, policy in policies.items():
    entries, group = policy.rewards(request)
    composers[name] = reward_composer(config, mesh, entries, group_size=group)
  # What evaluation reports (config.rewards over a prompt's samples): the composer of the policy trained on them,
  # when one is (its model-backed rewards are built once).
  composer = next((composers[n] for n, p in policies.items() if p.rewards_key == "rewards"), None) or \
      reward_composer(config, mesh)
  configs = plan.configs
  processor, glyph_tokenizer = processors(config, configs, [r.prompt for r in records + eval_records])
  for path, recs in ((config.data.prompts_file, records), (eval_source(config), eval_records)):
    check_prompt_lengths(processor, recs, path, config)
    check_glyph_fits([(r.prompt, f"{path}:{r.line}") for r in recs], glyph_tokenizer, config.data.max_glyph_tokens,
                     config.data.max_glyph_texts)
  if config.data.prompts_per_step > len(records):
    logging.warning("config.data.prompts_per_step=%d but %s holds %d prompts: every step repeats prompts",
                    config.data.prompts_per_step, config.data.prompts_file, len(records))
  iterator = PromptIterator(records, prompts_per_step=config.data.prompts_per_step, seed=config.seed,
                            height=config.data.height, width=config.data.width)
  if resume_data is not None:  # before any model: the checkpoint's prompt order must be this file's
    try:
      iterator.check_state(resume_data)
    except ValueError as e:
      raise UserError(f"{config.data.prompts_file}: the checkpoint to resume was saved with other prompts or "
                      f"another config.seed ({e}); resume with the ones it trained on, or train in a new --workdir"
                      ) from None
  # What the models' shapes decide (which layers the LoRA targets match, a checkpoint's bytes) is checked on
  # abstract models, by the run's own builder, before any weight is made or read.
  items = {}
  for policy in policies.values():
    if policy.settings.lora.enabled or checkpoints_in:
      model = glm_image.abstract_model(policy.component, getattr(configs, policy.component))
      state = build_state(policy, config, model, mesh, abstract=True, train=bool(checkpoints_in))
      items.update(state.checkpoint_items() if checkpoints_in else {})
  if checkpoints_in:
    check_space(checkpoints_in, items)
  return composers, composer, processor, glyph_tokenizer, iterator
