"""The released-model path as users run it, every step a subprocess: configs, training, eval, generate, export."""

import json
import os

from tests.test_main import run_main


def _rows(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_image_to_image_trains_past_step_two_with_evaluation(tmp_path):
  """The update donates the AR arrays; nothing else (pipeline, condition-image tokenizer, eval) may hold them."""
  result = run_main("--config=configs/glm_image_i2i.py:tiny", "--config.train.num_steps=3",
                    "--config.eval.interval=2", "--config.eval.prompts_file=configs/data/i2i_demo.jsonl",
                    tmp_path=tmp_path, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  rows = _rows(tmp_path)
  assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
  assert [r["step"] for r in rows if "eval/reward/mean" in r] == [2]
  for r in rows:
    if "reward/mean" in r:
      assert abs(r["first_iter/ratio/min"] - 1) <= 1e-6 and abs(r["first_iter/ratio/max"] - 1) <= 1e-6, r
