"""The generator's peer options as users turn them on, through main.py: verl's dual clip, GSPO's sequence-level
ratio, TRL's bias-corrected KL and sequence_mask importance weights, together on the demo for two steps of two
updates each (their formulas: tests/grpo/test_peer_options.py).

What each option must show in the logged metrics, exactly where the policy is known:
- step 1's first update is on-policy and its policy is the KL reference: the ratio is 1, the KL estimate 0 (k3 of
  equal log-probs, times the ratio 1 of the bias correction), no token is dual-clipped, and the sampler's and the
  learner's log-probs (float32: equal up to rounding) give every sequence the importance weight 1, none masked;
- after an update the policy has moved: the KL is above 0 (also at step 2's first update, against the reference);
- the ratio is one number per sequence, so every fraction of tokens a ratio decides (clipped below or above,
  dual-clipped, masked) is a whole number of the 16 sequences (the demo's loss covers the same target grid of every
  sample): 7 and 6 of 16 clipped after step 1's update, where token-level ratios clip tokens one by one.
The dual clip (c = 1.001) does not bind in these two steps: after an update the ratio of a sequence with a negative
advantage falls (tests/grpo/test_peer_options.py checks where it binds against verl's code).
"""

import numpy as np

from tests.cli import completed
from tests.train.test_decoder_algorithms import rows

SEQUENCES = 16  # the demo's 2 prompts x 8 samples, each with the same number of tokens in the loss (its 2x2 target grid)


def _whole_sequences(fraction: float) -> bool:
  return abs(fraction * SEQUENCES - round(fraction * SEQUENCES)) < 1e-4


def test_peer_options_train_through_main(tmp_path):
  workdir = tmp_path / "options"
  completed("--config=configs/demo.py", "--config.train.num_steps=2", "--config.grpo.num_iterations=2",
            "--config.grpo.dual_clip=1.001", "--config.grpo.ratio_level=sequence", "--config.grpo.beta=0.05",
            "--config.grpo.kl_bias_correction=True", "--config.grpo.tis_cap=2",
            "--config.grpo.tis_mode=sequence_mask", tmp_path=workdir)
  got = rows(workdir)
  assert sorted(got) == [1, 2]
  first = got[1]
  assert first["first_iter/ratio/min"] == first["first_iter/ratio/max"] == 1.0
  assert first["first_iter/kl"] == 0.0 and first["first_iter/clip/dual_frac"] == 0.0
  assert first["first_iter/tis/capped_frac"] == 0.0
  np.testing.assert_allclose(first["first_iter/tis/weight_mean"], 1.0, atol=1e-4)
  assert got[2]["first_iter/kl"] > 0.0
  for r in got.values():
    assert r["first_iter/ratio/min"] == r["first_iter/ratio/max"] == 1.0 and r["skipped"] == 0.0
    assert r["iter1/ratio/max"] != 1.0 and np.isfinite(r["iter1/loss"]) and r["iter1/kl"] > 0.0
    for key in ("iter1/clip/dual_frac", "iter1/clip/low_frac", "iter1/clip/high_frac", "iter1/tis/capped_frac"):
      assert _whole_sequences(r[key]), (r["step"], key, r[key])
  assert got[1]["iter1/clip/low_frac"] > 0.0 and got[1]["iter1/clip/high_frac"] > 0.0
