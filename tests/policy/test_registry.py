"""The decoder policy a config names, the rollout it asks for, its settings, and where a random SDE window lies."""

import pytest

from configs import demo_decoder
from glmrl.policy import decoder, decoder_matching, registry


@pytest.mark.parametrize("variant,policy,sde,clean", [
    ("flow_grpo", decoder.POLICY, True, False), ("cps", decoder.POLICY, True, False),
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
