"""Bad inputs fail in setup with a message naming the value, before any model is built or compiled."""

import glmrl  # noqa: F401

import pytest

from glmrl.programs import plan
from glmrl.models import glm_image
from glmrl.policy import registry
from glmrl.train import setup
from tests.train.common import tiny_config


@pytest.fixture(autouse=True)
def no_models(monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("a model was built before the inputs were checked")
  monkeypatch.setattr(glm_image, "build", fail)


def test_batch_must_divide_over_the_mesh():
  config = tiny_config(data__prompts_per_step=3, grpo__group_size=3)
  with pytest.raises(ValueError, match=r"3 x 3 = 9 do not divide over the mesh's data x fsdp = 2 x 2 = 4"):
    plan.check_batch(plan.draft(config), (2, 2, 2))
  # Micro-batches that do not split over data x fsdp are allowed (partly replicated), e.g. 16 on 32 chips.
  plan.check_batch(plan.draft(tiny_config(train__micro_batch_size=6, data__prompts_per_step=3)), (2, 2, 2))
  plan.check_batch(plan.draft(tiny_config(train__micro_batch_size=16, data__prompts_per_step=16, grpo__group_size=8)),
                    (1, 32, 1))
  with pytest.raises(ValueError, match="micro_batch_size=5 does not divide its update.s batch 12"):
    plan.check_batch(plan.draft(tiny_config(train__micro_batch_size=5, data__prompts_per_step=3)), (1, 1, 1))


@pytest.mark.parametrize("lines,message", [
    (['{"prompt": "a cat"}', '{"prompt": "a dog", "colour": 1}'], r"prompts.jsonl:2: .*unknown field"),
    (['{"prompt": "a cat"', ], r"prompts.jsonl:1: .*JSON"),
    (['{"prompt": "a cat", "source_images": ["missing.png"]}'], r"prompts.jsonl:1: .*missing.png"),
])
def test_bad_prompt_files(tmp_path, lines, message):
  path = tmp_path / "prompts.jsonl"
  path.write_text("\n".join(lines) + "\n")
  with pytest.raises(ValueError, match=message):
    setup.build(tiny_config(data__prompts_file=str(path)))


def test_mode_must_match_the_records(tmp_path):
  with pytest.raises(ValueError, match=r"demo_prompts.txt:1: data.mode='i2i' needs source_images"):
    setup.build(tiny_config(data__mode="i2i"))


def test_prompt_longer_than_the_fixed_length(tmp_path):
  path = tmp_path / "long.txt"
  path.write_text("a short one\n" + " ".join(["word"] * 40) + "\n")
  with pytest.raises(ValueError, match=r"long.txt:2: the prompt takes 49 tokens with its grids, more than config.data.max_prompt_tokens=32"):
    setup.build(tiny_config(data__prompts_file=str(path)))


def test_decoupled_batch_checks_name_the_decoder_fields():
  from tests.train.common import decoupled_config

  # 2 prompts x 4 grids = 8 AR rows, x 2 decoder samples = 16 images.
  plan.check_batch(plan.draft(decoupled_config()), (2, 2, 2))
  with pytest.raises(ValueError, match=r"AR sampler's rows prompts_per_step x group_size = 2 x 4 = 8 do not divide"):
    plan.check_batch(plan.draft(decoupled_config()), (1, 16, 1))
  with pytest.raises(ValueError, match="config.decoder.micro_batch_size=5 does not divide its update.s batch 16"):
    plan.check_batch(plan.draft(decoupled_config(decoder__micro_batch_size=5)), (1, 1, 1))
  with pytest.raises(ValueError, match=r"decode_batch=3 must divide the batch of 16 samples"):
    plan.check_batch(plan.draft(decoupled_config(sampling__decode_batch=3)), (1, 1, 1))


def test_decoder_policy_rematerialises_the_dit_with_model_remat():
  from tests.train.common import decoupled_config

  assert plan.model_configs(decoupled_config(model__remat=True)).dit.remat
  assert not plan.model_configs(decoupled_config(model__remat=False)).dit.remat
  # Without the decoder policy the DiT is never differentiated: its programs stay as they were.
  assert not plan.model_configs(tiny_config(model__remat=True)).dit.remat


def test_a_plan_holds_its_own_config():
  config = tiny_config(data__prompts_per_step=3)
  drafted = plan.draft(config)
  config.data.prompts_per_step = 5  # what the caller does with its object later
  assert drafted.config is not config and drafted.config.data.prompts_per_step == 3


def test_a_run_asks_for_its_plan_once_and_binds_its_policies_once(monkeypatch):
  """setup.build makes its plan in one call (draft, batch check and every `auto` inside), binding the policies
  once, to the plan's config, where the `auto` choices are written."""
  made, bound = [], []
  make, trained = plan.make, registry.trained
  monkeypatch.setattr(plan, "make", lambda *args, **kwargs: made.append(make(*args, **kwargs)) or made[-1])
  monkeypatch.setattr(registry, "trained", lambda config: bound.append(trained(config)) or bound[-1])
  with pytest.raises(AssertionError, match="a model was built"):  # past every check of the inputs
    setup.build(tiny_config(model__compute_dtype="bfloat16"))
  assert len(made) == 1 and len(bound) == 1 and bound[0] is made[0].policies
  config, choices = made[0].config, {c.key: c.value for c in made[0].choices}
  assert choices == {"model.dit_attention": "xla", "rollout.ar_weights": config.rollout.ar_weights}
  assert config.model.dit_attention == "xla" and config.rollout.ar_weights in ("update", "gathered")
  assert all(policy.config is config for policy in made[0].policies.values())
