"""The DiT policy a config names, the rollout it asks for, its settings, and where a random SDE window lies."""

import pytest

from configs import demo_decoder
from configs import glm_image_t2i_decoupled
from glmrl.policy import awm, flow_grpo, nft, registry
from glmrl.policy import ar as ar_policy


@pytest.mark.parametrize("variant,policy", [
    ("flow_grpo", flow_grpo.FlowGrpoPolicy), ("cps", flow_grpo.FlowGrpoPolicy), ("guard", flow_grpo.FlowGrpoPolicy),
    ("nft", nft.NftPolicy), ("awm", awm.AwmPolicy)])
def test_the_algorithm_picks_the_policy_and_its_rollout(variant, policy):
  c = demo_decoder.get_config(variant)
  trained = registry.trained(c)
  assert list(trained) == ["decoder"] and type(trained["decoder"]) is policy
  assert registry.decoding(trained) is trained["decoder"]
  request = registry.rollout_request(c)
  assert (request.grids_per_prompt, request.samples_per_grid) == (1, 8)


def test_one_rollout_serves_both_policies_and_the_dit_policy_decodes_it():
  c = glm_image_t2i_decoupled.get_config("tiny")
  trained = registry.trained(c)
  assert list(trained) == ["ar", "decoder"] and type(trained["ar"]) is ar_policy.ArPolicy
  assert registry.decoding(trained) is trained["decoder"]
  request = registry.rollout_request(c)
  assert (request.grids_per_prompt, request.samples_per_grid) == (c.grpo.group_size, c.decoder.group_size)
  c.train.policies = "ar"
  assert registry.decoding(registry.trained(c)) is None


def test_every_policy_saves_under_names_of_its_own():
  """Two policies never share a checkpoint item or record (the export finds each model by them)."""
  names = [n for saved in registry.SAVED.values()
           for n in (saved.params, saved.opt_state, saved.ema, saved.adapters_file, saved.model_config_file) if n]
  assert len(names) == len(set(names))
  for name, saved in registry.SAVED.items():
    assert registry.policy(name, demo_decoder.get_config()).saved is saved


def test_decoder_settings_carry_its_average_and_advantage_scale():
  c = demo_decoder.get_config("nft")
  c.decoder.adv_std = "batch"
  settings = registry.policy("decoder", c).settings
  assert settings.advantage_scale == "batch" and registry.policy("ar", c).settings.advantage_scale == "group"
  assert (settings.ema.decay, settings.ema.every, settings.ema.ramp) == (0.5, 1, 0.001)


@pytest.mark.parametrize("steps,size,window_range,starts", [
    (10, 2, (0, 0), (0, 3)),   # the first half: steps [0, 5)
    (4, 2, (0, 0), (0, 0)),    # 4 steps: [0, 2)
    (3, 2, (0, 0), (0, 0)),    # the half is shorter than the window: [0, 2), never the final step
    (10, 3, (2, 9), (2, 6)),   # explicit [2, 9): the final step (9) excluded
])
def test_random_window_lies_within_its_range_and_never_holds_the_final_step(steps, size, window_range, starts):
  c = demo_decoder.get_config()
  c.decoder.train_steps, c.decoder.window_size, c.decoder.window_range = steps, size, window_range
  assert flow_grpo.window_starts(c) == starts
  assert starts[1] + size <= steps - 1


def mixgrpo_starts(steps: int, every: int, stride: int, first: int, last: int, roll_back: bool) -> list[int]:
  """MixGRPO's progressive window start per training step, as its state machine runs (GRPOTrainingStates:
  `get_current_timesteps` before each step's rollout, `update_iteration` after it), rewritten here."""
  cur, in_group, out = first, 0, []
  for _ in range(steps):
    out.append(cur)
    in_group += 1
    if in_group >= every:
      in_group, cur = 0, cur + stride
    if cur > last:
      cur = first if roll_back else last
  return out


@pytest.mark.parametrize("every,stride,roll_back", [(3, 0, False), (2, 1, False), (1, 2, True), (2, 3, True)])
def test_sliding_window_walks_its_range_as_mixgrpo(every, stride, roll_back):
  c = demo_decoder.get_config()
  c.decoder.train_steps, c.decoder.window_size, c.decoder.window_range = 12, 2, (1, 10)
  c.decoder.window_slide_every, c.decoder.window_slide_stride = every, stride
  c.decoder.window_slide_roll_back = roll_back
  first, last = flow_grpo.window_starts(c)
  assert (first, last) == (1, 8)
  got = [int(flow_grpo.window_start(c, None, step)) for step in range(40)]
  assert got == mixgrpo_starts(40, every, stride or 2, first, last, roll_back)
  assert min(got) == first and max(got) <= last and (roll_back or max(got) == last)
