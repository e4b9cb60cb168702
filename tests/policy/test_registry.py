"""The decoder policy a config names, the rollout it asks for, its settings, and where a random SDE window lies."""

import pytest

from configs import demo_decoder
from glmrl.policy import decoder, decoder_matching, registry


@pytest.mark.parametrize("variant,policy,sde,clean", [
    ("flow_grpo", decoder.POLICY, True, False), ("cps", decoder.POLICY, True, False),
    ("guard", decoder.POLICY, True, False),
    ("nft", decoder_matching.NFT, False, True), ("awm", decoder_matching.AWM, False, True)])
def test_the_algorithm_picks_the_policy_and_its_rollout(variant, policy, sde, clean):
  c = demo_decoder.get_config(variant)
  assert registry.trained(c) == {"decoder": policy}
  request = registry.rollout_request(c)
  assert (request.sde, request.clean, request.samples_per_grid) == (sde, clean, 8)


def test_decoder_settings_carry_its_average_and_advantage_scale():
  c = demo_decoder.get_config("nft")
  c.decoder.adv_std = "batch"
  settings = registry.policy("decoder", c).settings(c)
  assert settings.advantage_scale == "batch" and registry.policy("ar", c).settings(c).advantage_scale == "group"
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
  assert decoder.window_starts(c) == starts
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
  first, last = decoder.window_starts(c)
  assert (first, last) == (1, 8)
  got = [int(decoder.window_start(c, None, step)) for step in range(40)]
  assert got == mixgrpo_starts(40, every, stride or 2, first, last, roll_back)
  assert min(got) == first and max(got) <= last and (roll_back or max(got) == last)
