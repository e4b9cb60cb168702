"""Full DiT fine-tuning through the Trainer (decoder.lora.rank=0): the KL reference is a copy of the initial DiT,
every DiT parameter trains and is checkpointed, and the periodic evaluation scores with the decoder's rewards."""

import glmrl  # noqa: F401

import json

import jax
import numpy as np
from flax import nnx

from glmrl.models import glm_image
from glmrl.train import loop
from tests.train.common import tiny_config


def test_full_dit_fine_tuning_with_kl_and_evaluation(tmp_path):
  c = tiny_config(train__num_steps=2, train__policies="decoder", eval__interval=2)
  c.eval.prompts_file = c.data.prompts_file
  c.decoder.group_size = 2
  c.decoder.train_steps = 3
  c.decoder.window_size = 2
  c.decoder.lora.rank = 0
  c.decoder.beta = 0.5
  c.decoder.optim.learning_rate = 1e-3
  result = loop.train(c, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  first, second = [r for r in rows if "decoder/loss" in r]
  # Step 1 compares the DiT with its own copy: KL 0 up to rounding (the policy's forward runs under jax.grad,
  # the reference's outside it); one update later the DiT has moved away.
  assert abs(first["decoder/kl"]) < 1e-9 and second["decoder/kl"] > 1e-6
  assert first["decoder/first_iter/ratio/min"] == first["decoder/first_iter/ratio/max"] == 1.0
  evals = [r for r in rows if "eval/decoder/reward/mean" in r]
  assert len(evals) == 1 and "eval/reward/mean" in evals[0]
  assert result["step"] == 2

  # The checkpoint holds the whole trained DiT (every parameter of the released transformer's paths).
  trainer = loop.Trainer(c, str(tmp_path))
  try:
    restored, initial = trainer.states["decoder"].trainable, glm_image.build(  # step 2's, and as built
        "dit", trainer.run.pipeline.configs.dit, seed=c.seed + list(glm_image.COMPONENTS).index("dit"))[1]
    paths = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(restored)}
    assert "blocks.0.attn.q.kernel" in paths and "image_proj.kernel" in paths
    moved = [not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(initial))]
    assert any(moved)
  finally:
    trainer.close()
