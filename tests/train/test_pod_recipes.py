"""Every released recipe as users run it on a pod: 2 processes x 4 host devices log the same per-step metrics as
1 process x 8 devices, with the recipe's `:tiny` shapes made to decode in several calls (16 images, one per device
per call) and, for the text-to-image recipe, micro-batches that split unevenly over the devices. The same
recipe's `--mode=eval` (a shipped benchmark, two checkpoints compared) and `--mode=generate` as 2 processes write
what one process writes. (configs/demo.py: tests/train/test_multihost.py.)

Tolerances as tests/train/test_multihost.py argues them: step 1 (the same initial parameters; the two launches'
collectives sum in different orders) within 1e-5 relative, step 2 (after an update whose AdamW step moves each
parameter by about lr * sign(gradient)) within 1e-3. The text-to-image recipes' JPEG-size reward (discontinuous
in the pixels) is weighted 1e-4 beside brightness, as there.
"""

import json

import numpy as np
import pytest

from tests.train.processes import assert_same_metrics, launch, rows

STEPS = ("--config.train.num_steps=2", "--config.checkpoint.save_interval=1")
CONTINUOUS = "--config.rewards=({'name': 'brightness', 'weight': 1.0}, {'name': 'jpeg_compressibility', 'weight': 1e-4})"
RECIPES = {
    "t2i": ("--config=configs/glm_image_t2i.py:tiny", "--config.grpo.group_size=8",
            "--config.train.micro_batch_size=4", CONTINUOUS),
    "lora": ("--config=configs/glm_image_t2i_lora.py:tiny", "--config.grpo.group_size=8", CONTINUOUS),
    "i2i": ("--config=configs/glm_image_i2i.py:tiny", "--config.grpo.group_size=8"),
    "decoupled_flow_grpo": ("--config=configs/glm_image_t2i_decoupled.py:tiny",),
    "decoupled_nft": ("--config=configs/glm_image_t2i_decoupled.py:tiny", "--config.decoder.algorithm=nft",
                      "--config.decoder.ema.every=1"),
}
KEYS = ("reward", "grad_norm", "advantage/std", "decoder/reward", "decoder/grad_norm", "decoder/advantage/std")


def _train(tmp_path, flags):
  multi, single = tmp_path / "multi", tmp_path / "single"
  errs = launch(multi, *flags, *STEPS)
  launch(single, *flags, *STEPS, processes=1, devices=8)
  assert "decoder calls of 8 samples" in errs[0]  # 16 images: the decode takes two calls
  # The defaults on 8 host devices: XLA's attention; the generator copy fits beside the resident state.
  assert "config.model.dit_attention=auto -> 'xla'" in errs[0]
  assert "config.rollout.ar_weights=auto -> 'gathered'" in errs[0]
  assert_same_metrics(rows(multi), rows(single), KEYS, rtol_first=1e-5, rtol=1e-3)
  return multi, single


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "t2i"])
def test_recipe_as_two_processes(recipe, tmp_path):
  _train(tmp_path, RECIPES[recipe])


def test_t2i_trains_evaluates_and_generates_as_two_processes(tmp_path):
  multi, single = _train(tmp_path, RECIPES["t2i"])
  evaluate = (*RECIPES["t2i"], "--mode=eval", "--config.eval.benchmark=parti:2", "--config.eval.steps=0,2")
  launch(multi, *evaluate)
  launch(single, *evaluate, processes=1, devices=8)
  got, want = (json.loads((w / "eval" / "report.json").read_text()) for w in (multi, single))
  assert got.keys() == want.keys()
  np.testing.assert_allclose(_numbers(got), _numbers(want), rtol=1e-5, atol=1e-6)
  assert sorted(p.name for p in (multi / "eval" / "images").rglob("*.png")) == \
      sorted(p.name for p in (single / "eval" / "images").rglob("*.png"))
  launch(multi, *RECIPES["t2i"], "--mode=generate")
  launch(single, *RECIPES["t2i"], "--mode=generate", processes=1, devices=8)
  got, want = (np.load(w / "generate" / "tokens.npz") for w in (multi, single))
  np.testing.assert_array_equal(got["tokens"], want["tokens"])
  np.testing.assert_allclose(got["logprobs"], want["logprobs"], rtol=1e-5, atol=1e-6)
  assert sorted(p.name for p in (multi / "generate").glob("*.png")) == \
      sorted(p.name for p in (single / "generate").glob("*.png"))


def _numbers(tree) -> np.ndarray:
  """Every number of a JSON tree, in its order."""
  if isinstance(tree, dict):
    return np.concatenate([_numbers(v) for v in tree.values()] or [np.zeros(0)])
  if isinstance(tree, list):
    return np.concatenate([_numbers(v) for v in tree] or [np.zeros(0)])
  if isinstance(tree, (int, float)) and not isinstance(tree, bool):
    return np.asarray([float(tree)])
  return np.zeros(0)
