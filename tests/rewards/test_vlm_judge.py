"""The VLM judge (glmrl.rewards.vlm_judge) against OpenAI chat-completions servers on loopback.

Protocol reference: the `openai` package's own types. Each request the judge sends is validated as openai's
`CompletionCreateParamsNonStreaming`, and the answers of the loopback server below are openai `ChatCompletion`s
(`transformers serve`, the real server of tests/rewards/test_vlm_judge_served.py, refuses `logprobs`, which the
`p_yes` rule needs). Scores against the float64 formula P(yes) / (P(yes) + P(no)) within 1e-6."""

import base64
import contextlib
import http.server
import io
import json
import math
import re
import socket
import threading
import time

import numpy as np
import pydantic
import pytest
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from PIL import Image

from glmrl import rewards
from glmrl.errors import UserError
from glmrl.rewards.remote import RemoteRewardError
from tests.cli import assert_one_line_error, main_in_process

REQUEST = pydantic.TypeAdapter(CompletionCreateParamsNonStreaming)
TOP = [(" Yes", -0.2), ("yes", -2.0), ("No", -1.5), ("maybe", -3.0)]
P_YES = (math.exp(-0.2) + math.exp(-2.0)) / (math.exp(-0.2) + math.exp(-2.0) + math.exp(-1.5))


def completion(content: str, top=None) -> bytes:
  """An openai ChatCompletion as JSON: `content`, and its first token's `top` (token, logprob) pairs."""
  logprobs = None
  if top is not None:
    logprobs = {"content": [{"token": content, "logprob": top[0][1], "bytes": None,
                             "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in top]}],
                "refusal": None}
  return ChatCompletion.model_validate({
      "id": "c", "object": "chat.completion", "created": 0, "model": "judge",
      "choices": [{"index": 0, "finish_reason": "length", "logprobs": logprobs,
                   "message": {"role": "assistant", "content": content}}]}).model_dump_json().encode()


@contextlib.contextmanager
def judge_server(answer, delay_s: float = 0.0):
  """A chat-completions endpoint: `answer(request) -> (status, body)`; every request is validated as openai's
  request type and recorded with its headers."""
  seen = []

  class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
      pass

    def do_POST(self):
      body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
      REQUEST.validate_python(body)
      seen.append((body, dict(self.headers)))
      time.sleep(delay_s)
      status, out = answer(body)
      try:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
      except (BrokenPipeError, ConnectionResetError):  # the client timed out first (the slow judge's test)
        pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions", seen
  finally:
    server.shutdown()
    server.server_close()


def _judge(url, **kwargs):
  entry = {"name": "vlm_judge", "weight": 1.0, "kwargs": {
      "url": url, "model": "judge", "template": "Does it show {prompt} in {style}? Yes or No.",
      "metadata_keys": ["style"], "retries": 0, "backoff_s": 0.0, **kwargs}}
  return rewards.RewardComposer([entry])


def _images(b=3):
  return np.random.default_rng(0).integers(0, 256, (b, 24, 24, 3), np.uint8)


def _image_of(body) -> np.ndarray:
  url = body["messages"][-1]["content"][0]["image_url"]["url"]
  assert url.startswith("data:image/png;base64,")
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))


def test_p_yes_scores_each_image_from_its_answers_top_logprobs_and_caches_what_it_asked():
  with judge_server(lambda body: (200, completion("Yes", TOP))) as (url, seen):
    composer = _judge(url, system="You judge images.")
    images, prompts = _images(), ["a red apple", "a cat", "a red apple"]
    metadata = {"style": ["oil", "ink", "ink"]}
    _, components = composer(images, prompts, metadata)
    np.testing.assert_allclose(components["vlm_judge"], [P_YES] * 3, rtol=1e-6)
    probe, *asked = seen
    assert probe[0]["messages"][-1]["content"][1]["text"] == "Does it show glmrl start-up check in None? Yes or No."
    assert len(asked) == 3
    for body, _ in asked:
      assert body["model"] == "judge" and body["temperature"] == 0.0 and body["max_completion_tokens"] == 1
      assert body["logprobs"] is True and body["top_logprobs"] == 20
      assert body["messages"][0] == {"role": "system", "content": "You judge images."}
    texts = sorted(body["messages"][-1]["content"][1]["text"] for body, _ in asked)
    assert texts == ["Does it show a cat in ink? Yes or No.", "Does it show a red apple in ink? Yes or No.",
                     "Does it show a red apple in oil? Yes or No."]
    got = {body["messages"][-1]["content"][1]["text"]: _image_of(body) for body, _ in asked}
    np.testing.assert_array_equal(got["Does it show a cat in ink? Yes or No."], images[1])  # PNG: lossless
    # The same images asked the same questions again: answered from the cache, nothing sent.
    _, again = composer(images, prompts, metadata)
    np.testing.assert_array_equal(again["vlm_judge"], components["vlm_judge"])
    assert len(seen) == 4
    composer(images, prompts, {"style": ["oil", "ink", "oil"]})  # one question differs: one request
    assert len(seen) == 5


def test_parsed_reads_a_number_on_the_scale():
  answers = iter(["Score: 7", "score 10.", "I'd say 2.5/10"])
  with judge_server(lambda body: (200, completion(next(answers, "5")))) as (url, seen):
    composer = _judge(url, rule="parsed", pattern=r"([0-9]+(?:\.[0-9]+)?)", scale=(0, 10), max_tokens=8,
                      max_concurrency=1)
    _, components = composer(_images(), ["a", "b", "c"], {"style": ["x"] * 3})
  # One request at a time, in order: the probe read "Score: 7", the images the next three answers.
  np.testing.assert_allclose(components["vlm_judge"], [1.0, 0.25, 0.5], rtol=1e-6)
  assert all(body["max_completion_tokens"] == 8 and "logprobs" not in body for body, _ in seen)


@pytest.mark.parametrize("answer,kwargs,message", [
    ((200, b"<html>busy</html>"), {}, "(image 1): not a chat completion"),
    ((200, completion("Maybe", [("Maybe", -0.1), ("Perhaps", -2.0)])), {},
     "(image 1): the answer's top 2 tokens hold neither 'yes' nor 'no': ['Maybe', 'Perhaps']"),
    ((200, completion("Yes")), {}, "(image 1): the answer has no top_logprobs of its first token"),
    ((200, completion("great")), {"rule": "parsed", "pattern": r"(\d+)"},
     "(image 1): the answer 'great' does not match pattern='(\\\\d+)'"),
    ((200, completion("12")), {"rule": "parsed", "pattern": r"(\d+)"},
     "(image 1): the answer '12' reads 12, outside scale=(0, 10)"),
    ((500, b'{"error": "CUDA out of memory"}'), {}, "(image 1): failed after 1 attempt(s); last error: HTTP 500"),
])
def test_an_answer_that_cannot_be_scored_is_an_error_naming_the_server_and_the_image(answer, kwargs, message):
  calls = []

  def answers(body):
    calls.append(body)
    ok = completion("7") if kwargs.get("rule") == "parsed" else completion("Yes", TOP)
    return (200, ok) if len(calls) in (1, 2, 4) else answer  # the probe, image 0 and image 2 answered well

  with judge_server(answers) as (url, _):
    composer = _judge(url, max_concurrency=1, **kwargs)
    with pytest.raises(RemoteRewardError) as e:
      composer(_images(), ["a", "b", "c"], {"style": ["x"] * 3})
  assert str(e.value).startswith(f"VLM judge {url} {message}"), str(e.value)
  assert "\n" not in str(e.value)


def test_an_unreachable_or_slow_judge_is_refused_at_start_up_in_one_line():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  with pytest.raises(RemoteRewardError, match=r"^VLM judge http://127.0.0.1:\d+/v1/chat/completions \(start-up "
                                              r"check\): failed after 1 attempt\(s\); last error: connection failed"
                                              r".*; start the judge's server or fix the url$"):
    _judge(f"http://127.0.0.1:{port}/v1/chat/completions")
  with judge_server(lambda body: (200, completion("Yes", TOP)), delay_s=1.0) as (url, _):
    with pytest.raises(RemoteRewardError, match=r"\(start-up check\): failed after 1 attempt\(s\); last error: "
                                                r"timed out after 0.3 s"):
      _judge(url, timeout_s=0.3)


def test_the_api_key_comes_from_the_environment_and_is_never_shown(monkeypatch):
  monkeypatch.delenv("GLMRL_TEST_JUDGE_KEY", raising=False)
  with pytest.raises(UserError, match="api_key_env='GLMRL_TEST_JUDGE_KEY' names an environment variable that is "
                                      "not set"):
    _judge("http://127.0.0.1:1/v1/chat/completions", api_key_env="GLMRL_TEST_JUDGE_KEY")
  monkeypatch.setenv("GLMRL_TEST_JUDGE_KEY", "sk-secret-123")
  with judge_server(lambda body: (401, b'{"error": "bad key"}')) as (url, seen):
    with pytest.raises(RemoteRewardError) as e:
      _judge(url, api_key_env="GLMRL_TEST_JUDGE_KEY")
  assert seen[0][1]["Authorization"] == "Bearer sk-secret-123"
  assert "sk-secret" not in str(e.value) and "HTTP 401: bad key" in str(e.value)


@pytest.mark.parametrize("kwargs,message", [
    ({"template": "Is it {subject}?"}, "template='Is it {subject}?' names ['subject']: it may name {prompt} and "
                                       "the metadata_keys ['style']"),
    ({"rule": "logits"}, "rule='logits' must be one of ['p_yes', 'parsed']"),
    ({"rule": "parsed"}, "rule='parsed' needs a pattern with a group around the number"),
    ({"rule": "parsed", "pattern": r"(\d+)", "scale": (10, 0)}, "scale=(10, 0) must be (lo, hi)"),
    ({"yes": "No"}, "yes='No' and no='no' must differ"),
    ({"max_concurrency": 0}, "max_concurrency=0 must be an integer >= 1"),
])
def test_settings_are_checked_before_any_request(kwargs, message):
  with judge_server(lambda body: (200, completion("Yes", TOP))) as (url, seen):
    with pytest.raises(ValueError, match=re.escape(message)):
      _judge(url, **kwargs)
    assert not seen


def _train(url, tmp_path, **kwargs):
  entry = {"name": "vlm_judge", "weight": 1.0, "kwargs": {"url": url, "model": "judge", "template": "{prompt}?",
                                                           "retries": 1, "backoff_s": 0.0, **kwargs}}
  return main_in_process("--config=configs/demo.py", f"--config.rewards=({entry!r},)", tmp_path=tmp_path)


def test_a_garbage_unreachable_or_frozen_judge_ends_the_run_in_one_line_before_any_model(tmp_path):
  with judge_server(lambda body: (200, b"Internal error")) as (url, _):
    result = _train(url, tmp_path / "garbage")
  assert_one_line_error(result, f"VLM judge {url} (start-up check): not a chat completion (JSONDecodeError: ")
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    closed = f"http://127.0.0.1:{s.getsockname()[1]}/v1/chat/completions"
  assert_one_line_error(_train(closed, tmp_path / "down"), f"VLM judge {closed} (start-up check): failed after 2 "
                        "attempt(s); last error: connection failed")
  with judge_server(lambda body: (200, completion("Yes", TOP)), delay_s=1.0) as (url, _):
    result = _train(url, tmp_path / "frozen", timeout_s=0.2)
  assert_one_line_error(result, f"VLM judge {url} (start-up check): failed after 2 attempt(s); last error: timed out "
                        "after 0.2 s")
  assert not any((tmp_path / name).exists() for name in ("garbage", "down", "frozen"))  # the workdirs as found
