"""The VLM judge against a real OpenAI-compatible server: `transformers serve` (a process on loopback) serving the
tiny vision-language model of tests/rewards/tiny_vlm.py, whose answer is "7" whatever it is asked. The `parsed` rule
scores it; the `p_yes` rule is refused at start-up (transformers serve answers without the log-probabilities it
asked for, tests/rewards/test_vlm_judge.py has it against the openai package's types); the demo trains with the
judge as one of its rewards and `--mode=eval` reports its column."""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest

from glmrl import rewards
from glmrl.rewards.remote import RemoteRewardError
from tests.cli import ROOT, TIMEOUT_S, main_in_process
from tests.rewards import tiny_vlm
from tests.train.processes import free_port

PARSED = {"rule": "parsed", "pattern": "([0-9])", "scale": [0, 10], "max_tokens": 4, "retries": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  """(chat-completions URL, model name, the request lines the server logged so far)."""
  folder = str(tmp_path_factory.mktemp("judge") / "tiny-vlm")
  tiny_vlm.build(folder)
  port = free_port()
  server = subprocess.Popen(
      [sys.executable, "-m", "transformers.cli.transformers", "serve", folder, "--host", "127.0.0.1",
       f"--port={port}", "--device=cpu", "--dtype=float32", "--log-level=info"],
      cwd=ROOT, env={**os.environ, **tiny_vlm.OFFLINE_ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)
  lines = []
  threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
  try:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
      assert server.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
      try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
          if answer.status == 200:
            break
      except OSError:
        time.sleep(0.25)
    yield (f"http://127.0.0.1:{port}/v1/chat/completions", folder,
           lambda: [line for line in lines if '"POST /v1/chat/completions' in line])
  finally:
    server.terminate()
    server.wait(timeout=30)


def _entry(url, model, **kwargs):
  return {"name": "vlm_judge", "weight": 1.0,
          "kwargs": {"url": url, "model": model, "template": "Rate this image of {prompt} from 0 to 9.", **kwargs}}


def test_the_parsed_rule_scores_the_servers_answers_and_repeats_come_from_the_cache(served):
  url, model, posts = served
  composer = rewards.RewardComposer([_entry(url, model, **PARSED)])
  assert len(posts()) == 1  # the start-up check
  images = np.random.default_rng(0).integers(0, 256, (3, 48, 48, 3), np.uint8)
  _, components = composer(images, ["a cat", "a dog", "a cat"], {})
  np.testing.assert_allclose(components["vlm_judge"], [0.7] * 3, rtol=1e-6)
  assert len(posts()) == 4 and all('" 200' in line for line in posts())
  composer(images, ["a cat", "a dog", "a cat"], {})
  assert len(posts()) == 4  # the same images asked the same questions: not sent again


def test_p_yes_needs_log_probabilities_which_transformers_serve_does_not_return(served):
  url, model, _ = served
  with pytest.raises(RemoteRewardError) as e:
    rewards.RewardComposer([_entry(url, model, retries=0)])
  assert str(e.value) == (
      f"VLM judge {url} (start-up check): the answer has no top_logprobs of its first token (got logprobs null): "
      "the server must return log-probabilities for rule='p_yes'; the server must answer OpenAI chat completions as "
      "the rule needs")


def test_the_demo_trains_with_the_judge_and_its_evaluation_reports_the_judges_column(served, tmp_path):
  url, model, _ = served
  judged = ("--config=configs/demo.py", "--config.log.image_interval=0",
            "--config.rewards=({'name': 'brightness', 'weight': 1.0}, " + repr(_entry(url, model, **PARSED)) + ")")
  train = main_in_process(*judged, "--config.train.num_steps=1", "--config.checkpoint.save_interval=1",
                          tmp_path=tmp_path)
  assert train.returncode == 0, train.stderr[-3000:]
  (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert row["reward/vlm_judge/mean"] == pytest.approx(0.7) and row["time/reward/vlm_judge"] > 0
  evaluated = main_in_process(*judged, "--mode=eval", "--config.eval.benchmark=parti:2", "--config.eval.steps=0,1",
                              "--config.data.max_prompt_tokens=64", tmp_path=tmp_path)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  report = json.loads((tmp_path / "eval" / "report.json").read_text())
  assert report["rewards"]["reward/vlm_judge"]["overall"]["mean"]["1"]["mean"] == pytest.approx(0.7)
