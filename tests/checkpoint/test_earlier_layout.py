"""A checkpoint written before the trained policies became `glmrl/policy/` (commit 176fb81: both policies, AR and
DiT LoRA) resumes, and the step after it logs what that run logged.

Not bit for bit: XLA's CPU code differs with the CPU's vector instructions, and float32 results with it in their
last digits (this machine, an AMD EPYC without AVX-512, against the one that wrote the fixture: the gradient norms
agree to 7e-6 relative, the near-zero advantage means and losses to 1.1e-5 absolute). A leaf restored into the
wrong place changes the KL and the gradient norms by far more than that."""

import json
import pathlib
import shutil

import jax
import numpy as np

from configs import glm_image_t2i_decoupled
from glmrl.checkpoint.fingerprint import SCHEME
from glmrl.models.ar import text
from glmrl.models.dit import attention
from glmrl.train import loop

FIXTURE = pathlib.Path(__file__).parents[1] / "fixtures" / "checkpoint_176fb81"


def test_resumes_and_the_next_step_is_bit_identical(tmp_path, monkeypatch):
  # That run's DiT attention (`xla` was jax.nn.dot_product_attention then; the heads-major kernel that replaced it
  # rounds differently): the comparison is of the checkpoint's layout, bit for bit.
  monkeypatch.setattr(attention, "xla", lambda q, k, v, mask: jax.nn.dot_product_attention(q, k, v, mask=mask))
  # Likewise the AR sampler's cached attention: that run read a [B, T, K, D] cache through `gqa_attention`'s
  # products (its sampled tokens are the same either way; the sampler's own log-probs round differently).
  monkeypatch.setattr(text, "cached_gqa_attention",
                      lambda q, k, v, mask: text.gqa_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask))
  # Its lora.json records the base's fingerprint in the earlier, rounded-float form (checked by its folder, then
  # rewritten in the exact form).
  shutil.copytree(FIXTURE, tmp_path / "checkpoints", ignore=shutil.ignore_patterns("*.md", "step5_metrics.json"))
  config = glm_image_t2i_decoupled.get_config("tiny")
  config.train.num_steps = 5
  config.checkpoint.save_interval = 2
  config.log.image_interval = 0
  config.sampling.decode_batch = -1  # as that run decoded (then 0's meaning); chunks change XLA's blocking
  # The SDE window that run drew for step 5 (`decoder/window_start` 2 of its metrics): random windows now lie in
  # decoder.window_range, which would draw another; a fixed start puts it where that run had it.
  config.decoder.window_start = 2
  config.decoder.beta = 0.0  # that run's decoder had no KL anchor (the recipe's default then)
  trainer = loop.Trainer(config, str(tmp_path))
  try:
    assert trainer.step_index == 4
    scalars = trainer.step()
  finally:
    trainer.close()
  want = json.loads((FIXTURE / "step5_metrics.json").read_text())
  del want["step"]
  got = {k: float(scalars[k]) for k in want}
  np.testing.assert_allclose([got[k] for k in want], list(want.values()), rtol=1e-4, atol=3e-5,
                             err_msg=str(sorted(want)))
  for record in ("lora.json", "decoder_lora.json"):
    assert json.loads((tmp_path / "checkpoints" / record).read_text())["base"]["fingerprint"].startswith(SCHEME)
