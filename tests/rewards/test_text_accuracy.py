"""Text accuracy: golden edit distances, Flow-GRPO's normalisation, and the reward end to end through
the reference server with a stand-in OCR scorer (it returns the reading each test puts in metadata).
Scores are compared exactly where they are ratios of small integers (1e-6 for float32 outputs).
"""

import glmrl  # noqa: F401

import contextlib
import threading

import numpy as np
import pytest

from glmrl import rewards
from glmrl.rewards import server as server_lib
from glmrl.rewards import text_accuracy as ta

EDIT_GOLDEN = [
    ("kitten", "sitting", 3),
    ("flaw", "lawn", 2),
    ("intention", "execution", 5),
    ("", "abc", 3),
    ("abc", "", 3),
    ("", "", 0),
    ("same", "same", 0),
    ("café", "cafe", 1),
    ("ab", "ba", 2),  # plain Levenshtein: no transpositions
]


@pytest.mark.parametrize("a, b, d", EDIT_GOLDEN)
def test_edit_distance_golden(a, b, d):
  assert ta.edit_distance(a, b) == d
  assert ta.edit_distance(b, a) == d


@pytest.mark.parametrize("pattern, text, d", [
    ("abc", "xxabcxx", 0),
    ("abd", "xxabcxx", 1),
    ("hello", "", 5),
    ("", "anything", 0),
    ("sale", "open sale now", 0),
    ("sael", "opensalenow", 1),  # "sal": delete the e
    ("world", "wrld", 1),
])
def test_substring_edit_distance_golden(pattern, text, d):
  assert ta.substring_edit_distance(pattern, text) == d


def test_substring_distance_is_min_over_substrings():
  rng = np.random.default_rng(0)
  for _ in range(200):
    p = "".join(rng.choice(list("abc"), rng.integers(0, 5)))
    t = "".join(rng.choice(list("abc"), rng.integers(0, 7)))
    brute = min(ta.edit_distance(p, t[i:j]) for i in range(len(t) + 1) for j in range(i, len(t) + 1))
    assert ta.substring_edit_distance(p, t) == brute, (p, t)


def _flow_grpo(prompt: str, recognized: str) -> float:
  """Flow-GRPO's OcrScorer reward for one image, as published (first double-quoted span)."""
  target = prompt.split('"')[1].replace(" ", "").lower()
  recognized = recognized.replace(" ", "").lower()
  dist = 0 if target in recognized else ta.edit_distance(recognized, target)
  return 1 - min(dist, len(target)) / len(target)


@pytest.mark.parametrize("reading", ["HELLO WORLD!!", "helo world", "", "hello", "xyzxyzxyzxyzxyzxyz",
                                     "h e l l o   w o r l d", "jello wild"])
def test_matches_flow_grpo_on_single_text_prompts(reading):
  prompt = 'New York skyline with "Hello World" written in fireworks'
  want = _flow_grpo(prompt, reading)
  assert ta.text_accuracy([prompt], [reading])[0] == pytest.approx(want, abs=1e-6)


def test_text_score_values():
  assert ta.text_score("Hello World", "helo world") == pytest.approx(0.9)   # 1 edit / 10 chars
  assert ta.text_score("ab", "xyz") == 0.0                                    # distance 3 capped at 2
  assert ta.text_score("Sale", "big SALE today") == 1.0                       # substring
  assert ta.text_score("Sale", "big SAEL today", "flow_grpo") == 0.0          # whole-reading distance, capped
  assert ta.text_score("Sale", "big SAEL today", "substring") == 0.75         # "sae": 1 edit / 4 chars
  with pytest.raises(ValueError, match="match='exact' must be one of"):
    ta.text_score("a", "a", "exact")
  with pytest.raises(ValueError, match="empty after normalisation"):
    ta.text_score("  ", "a")


def test_multi_text_prompts_and_quote_kinds():
  prompt = "a shop with \u201cOPEN\u201d on the door and a \"SALE 50%\" banner"
  assert ta.expected_texts(prompt) == ["OPEN", "SALE 50%"]
  np.testing.assert_allclose(ta.text_accuracy([prompt], ["open sale50%"]), [1.0])
  # "open" alone: OPEN is a substring (1.0); "open" -> "sale50%" takes 6 edits (keeping the e): 1/7.
  np.testing.assert_allclose(ta.text_accuracy([prompt], ["open"]), [(1 + 1 / 7) / 2], rtol=0, atol=1e-6)
  # "opan sale50%": flow_grpo charges OPEN for the whole reading (capped: 0.0), substring mode 1 edit.
  np.testing.assert_allclose(ta.text_accuracy([prompt], ["opan sale50%"]), [0.5])
  np.testing.assert_allclose(ta.text_accuracy([prompt], ["opan sale50%"], match="substring"), [(0.75 + 1) / 2])
  assert ta.expected_texts('an empty sign "   "') == []
  with pytest.raises(ValueError, match="has no quoted text"):
    ta.text_accuracy(["a cat"], [None])
  np.testing.assert_allclose(ta.text_accuracy(["a cat"], [None], no_text_score=0.25), [0.25])


@pytest.mark.parametrize("reading", ["OPEN", "open sesame", "", "s sign open it", "OPAN"])
def test_flow_grpo_targets_are_the_first_double_quoted_span(reading):
  """targets="flow_grpo": Flow-GRPO's target rule, where the glyph rule also takes the span between apostrophes."""
  prompt = 'A bakery\'s sign "OPEN", it\'s'
  assert ta.expected_texts(prompt, "flow_grpo") == ["OPEN"]
  assert ta.expected_texts(prompt) == ['s sign "OPEN", it', "OPEN"]
  got = ta.text_accuracy([prompt], [reading], targets="flow_grpo")[0]
  assert got == pytest.approx(_flow_grpo(prompt, reading), abs=1e-6)
  assert ta.expected_texts('two "A" and "B"', "flow_grpo") == ["A"] and ta.expected_texts("no quotes", "flow_grpo") == []
  with pytest.raises(ValueError, match="targets='first' must be one of"):
    ta.expected_texts(prompt, "first")


@contextlib.contextmanager
def ocr_server():
  """Reference server whose 'OCR' returns metadata['reading']; records the prompts it was sent."""
  seen = []

  def fake_ocr(images, prompts, metadata):
    if metadata[0]["reading"] is None:  # the client's start-up check, sent when a reward is built
      return [""]
    seen.extend(prompts)
    return [m["reading"] for m in metadata]

  server = server_lib.RewardServer(fake_ocr, port=0)
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
  thread.start()
  try:
    yield server.url, seen
  finally:
    server.shutdown()
    server.server_close()


def test_reward_through_ocr_server():
  prompts = ['a sign "Hello"', "a cat", 'poster "GRPO" and "JAX"', 'a sign "Hello"']
  readings = ["hello", "meow", "grpo jux", "help"]
  images = np.zeros((4, 16, 16, 3), np.uint8)
  with ocr_server() as (url, seen):
    composer = rewards.RewardComposer([{"name": "text_accuracy", "weight": 1.0, "kwargs": {
        "url": url, "metadata_keys": ["reading"], "no_text_score": 0.0, "chunk_size": 2, "retries": 0}}])
    total, parts = composer(images, prompts, {"reading": np.asarray(readings)})
    assert sorted(seen) == sorted([prompts[0], prompts[2], prompts[3]])  # the text-less one is not sent
  # "grpojux": GRPO is a substring; JAX is charged for all 7 characters read (capped at 3).
  want = [1.0, 0.0, 0.5, 1 - 2 / 5]
  np.testing.assert_allclose(parts["text_accuracy"], want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(total, want, rtol=0, atol=1e-6)


def test_reward_errors_before_sending():
  with ocr_server() as (url, seen):
    fn = rewards.get("text_accuracy").build(url=url, metadata_keys=["reading"]).fn
    with pytest.raises(ValueError, match=r"prompt\(s\) \['a cat'\] have no quoted text"):
      fn(np.zeros((2, 16, 16, 3), np.uint8), ['"x"', "a cat"], {"reading": ["x", "y"]})
    with pytest.raises(ValueError, match="1 prompts for 2 images"):
      fn(np.zeros((2, 16, 16, 3), np.uint8), ['"x"'], {"reading": ["x", "y"]})
    assert seen == []
  with pytest.raises(ValueError, match="match='fuzzy' must be one of"):
    rewards.RewardComposer([{"name": "text_accuracy", "weight": 1.0, "kwargs": {"url": url, "match": "fuzzy"}}])
