"""The generator's peer options as users turn them on, through main.py: verl's dual clip, GSPO's sequence-level
ratio, TRL's bias-corrected KL and sequence_mask importance weights, together on the demo for two steps of two
updates each (their formulas: tests/grpo/test_peer_options.py)."""

import numpy as np

from tests.train.test_decoder_algorithms import main, rows


def test_peer_options_train_through_main(tmp_path):
  workdir = tmp_path / "options"
  main("--config=configs/demo.py", "--config.train.num_steps=2", "--config.grpo.num_iterations=2",
       "--config.grpo.dual_clip=3", "--config.grpo.ratio_level=sequence", "--config.grpo.beta=0.05",
       "--config.grpo.kl_bias_correction=True", "--config.grpo.tis_cap=2", "--config.grpo.tis_mode=sequence_mask",
       f"--workdir={workdir}")
  for r in rows(workdir).values():
    # On-policy the sequence ratio is exp(0) = 1 exactly; the second update moved it.
    assert r["first_iter/ratio/min"] == r["first_iter/ratio/max"] == 1.0
    assert r["iter1/ratio/max"] != 1.0 and np.isfinite(r["iter1/loss"]) and r["skipped"] == 0.0
    assert 0.0 <= r["clip/dual_frac"] <= 1.0 and 0.0 <= r["tis/capped_frac"] <= 1.0 and r["kl"] >= 0.0
