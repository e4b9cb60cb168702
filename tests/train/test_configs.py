"""The experiment configs load and validate; the real-size ones have the released shapes (eval_shape only)."""

import glmrl  # noqa: F401

import importlib

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from glmrl import sharding
from glmrl.config import rules, validation
from glmrl.programs import plan
from glmrl.models import glm_image
from glmrl.models.ar.prompt import GenerationLayout
from glmrl.policy import ar as ar_policy
from glmrl.policy import optimizer, registry
from glmrl.policy.ar import TRAINABLE
from glmrl.policy.state import num_params
from glmrl.sampling.logprobs import sampling_config
from glmrl.train import setup


def load(name, arg=None):
  return importlib.import_module(f"configs.{name}").get_config(arg)


@pytest.mark.parametrize("name", ["glm_image_t2i", "glm_image_i2i"])
def test_real_configs_need_a_checkpoint_and_have_the_paper_defaults(name, tmp_path):
  c = load(name)
  with pytest.raises(rules.ConfigError, match="config.model.checkpoint_dir is required"):
    validation.validate(c)
  c.model.checkpoint_dir = str(tmp_path)
  with pytest.raises(rules.ConfigError, match="config.data.prompts_file is required"):
    validation.validate(c)
  (tmp_path / "prompts.jsonl").write_text('{"prompt": "a cat"}\n')
  c.data.prompts_file = str(tmp_path / "prompts.jsonl")
  validation.validate(c)
  assert (c.grpo.group_size, c.sampling.temperature, c.sampling.top_p) == (16, 0.9, 0.75)
  assert (c.data.height, c.data.width, c.sampling.dit_steps, c.sampling.guidance_scale) == (1024, 1024, 50, 1.5)


@pytest.mark.parametrize("name", ["demo", "demo_decoder", "glm_image_t2i", "glm_image_i2i", "glm_image_t2i_lora",
                                  "glm_image_t2i_decoupled"])
def test_tiny_configs_validate(name):
  c = load(name, None if name.startswith("demo") else "tiny")
  validation.validate(c)
  setup.load_records(plan.draft(c))  # the bundled prompt files fit the mode


# The slices the released recipes' compile reports were made for (docs/reference/fits.md, docs/benchmarks.md),
# and the same shrunk by flags.
SLICES = [("glm_image_t2i", 32, {}), ("glm_image_t2i", 256, {"mesh.fsdp": 128, "mesh.tensor": 2}),
          ("glm_image_t2i", 64, {}), ("glm_image_t2i", 4, {}), ("glm_image_t2i", 8, {}),
          ("glm_image_t2i_lora", 1, {}), ("glm_image_t2i_decoupled", 32, {"decoder.micro_batch_size": 32})]


@pytest.mark.parametrize("name,chips,flags", SLICES)
@pytest.mark.parametrize("shrink", [{}, {"data.prompts_per_step": 4}, {"data.prompts_per_step": 2},
                                    {"grpo.group_size": 8}])
def test_released_configs_fit_every_listed_slice_unchanged_and_shrunk(name, chips, flags, shrink):
  """The batch checks of a run (`plan.check_batch`) pass for the released configs on each slice listed above,
  as shipped and shrunk by flags: `sampling.decode_batch` = 0 picks a chunk that fits every batch."""
  c = load(name)
  for key, value in {**flags, **shrink}.items():
    group, field = key.split(".")
    c[group][field] = value
  shape = sharding.mesh_shape(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, chips)
  rows = c.data.prompts_per_step * registry.rollout_request(c).grids_per_prompt
  if rows % (shape[0] * shape[1]):  # the AR sampler's own rule, whatever the decoder's chunk
    with pytest.raises(ValueError, match="do not divide over the mesh's data x fsdp"):
      plan.check_batch(plan.draft(c), shape)
  else:
    plan.check_batch(plan.draft(c), shape)


def test_decoupled_config_names_each_required_reward_input(tmp_path):
  c = load("glm_image_t2i_decoupled")
  c.model.checkpoint_dir = str(tmp_path)
  (tmp_path / "prompts.txt").write_text('a poster that says "GRPO"\n')
  c.data.prompts_file = str(tmp_path / "prompts.txt")
  with pytest.raises(rules.ConfigError, match=r"config.rewards\[0\].kwargs.clip_dir is required"):
    validation.validate(c)
  c.rewards[0].kwargs.clip_dir = c.rewards[0].kwargs.head_dir = c.rewards[1].kwargs.ckpt_dir = str(tmp_path)
  with pytest.raises(rules.ConfigError, match=r"config.decoder.rewards\[0\].kwargs.url is required"):
    validation.validate(c)
  c.decoder.rewards[0].kwargs.url = "http://localhost:1"
  validation.validate(c)
  # --mode=compile builds no reward that takes kwargs: the recipe compiles without them.
  c = load("glm_image_t2i_decoupled")
  c.compile.topology = "v5p-64"
  validation.validate(c, mode="compile")
  assert (c.train.policies, c.grpo.group_size, c.decoder.group_size) == ("ar+decoder", 8, 4)
  assert (c.decoder.noise_level, c.decoder.train_steps, c.decoder.clip_range, c.decoder.lora.targets) == \
      (0.7, 10, 1e-4, "dit")
  assert c.sampling.dit_steps == 50  # evaluation keeps the released 50 steps


def test_full_size_train_state_shapes():
  """AR parameters, optimizer state and the update step of the 1024^2 config, from abstract shapes."""
  c = load("glm_image_t2i")
  configs = glm_image.with_dtypes(glm_image.preset_configs("full"), param_dtype=jnp.float32,
                                  compute_dtype=jnp.bfloat16, remat=True)
  graphdef, abstract = glm_image.abstract_model("ar", configs.ar)
  model = nnx.merge(graphdef, abstract)
  graphdef, trainable, frozen = nnx.split(model, TRAINABLE, ...)
  n_trainable, n_frozen = num_params(trainable), num_params(frozen)
  assert n_trainable + n_frozen == 10_114_245_632
  tx, schedule = optimizer.make_optimizer(c.optim, c.train.num_steps, c.grpo.num_iterations)
  opt_state = jax.eval_shape(lambda p: optimizer.init(tx, p), trainable)
  # AdamW keeps two float32 moments per trained parameter.
  assert num_params(opt_state) == 2 * n_trainable + 2  # + the two step counters
  # bfloat16 parameters add their float32 master copy (docs/training.md: memory per trained parameter).
  trainable16 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), trainable)
  opt_state16 = jax.eval_shape(lambda p: optimizer.init(tx, p), trainable16)
  assert num_params(opt_state16) == 3 * n_trainable + 2
  assert {x.dtype for x in jax.tree.leaves(opt_state16)} == {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}

  layout = GenerationLayout.for_size(c.data.height, c.data.width, text_to_image=True)
  n, prompt_len, batch = layout.num_new_tokens, c.data.max_prompt_tokens, c.train.micro_batch_size
  assert (layout.target_hw, n) == ((32, 32), 32 * 32 + 16 * 16 + 1)
  sds = jax.ShapeDtypeStruct
  rollout = ar_policy.Rollout(
      sequence_ids=sds((batch, prompt_len + n), jnp.int32), positions=sds((3, batch, prompt_len + n), jnp.int32),
      valid=sds((batch, prompt_len + n), bool), sampler_logp=sds((batch, n), jnp.float32),
      old_logp=sds((batch, n), jnp.float32),
      advantages=sds((batch,), jnp.float32), mask=sds((batch, n), jnp.float32))
  spec = ar_policy.UpdateSpec(prompt_len=prompt_len, layout=layout, sampling=sampling_config(c.sampling),
                             micro_batches=1, epsilon_low=0.2, epsilon_high=0.28, beta=0.0, kl="k3",
                             aggregation="seq_mean_token_mean", remat=True)
  new_params, new_opt, metrics, (old_logp, _) = jax.eval_shape(
      lambda p, f, o, r: ar_policy.update(graphdef, p, f, o, r, None, True, spec=spec, tx=tx, schedule=schedule),
      trainable, frozen, opt_state, rollout)
  assert old_logp.shape == (batch, n) and old_logp.dtype == jnp.float32
  assert jax.tree.map(lambda a: (a.shape, a.dtype), new_params) == jax.tree.map(lambda a: (a.shape, a.dtype),
                                                                                 trainable)
  assert metrics["loss"].shape == ()
