"""OCR word accuracy and NED against hand-computed values, and both rewards through the reference server with a
scripted OCR scorer on loopback (the target text from metadata['text'], as the `ocr` benchmark supplies it); an
OCR server that is down is an error."""

import glmrl  # noqa: F401

import numpy as np
import pytest

from glmrl import rewards
from glmrl.errors import UserError
from glmrl.rewards import ocr_metrics
from tests.rewards.test_text_accuracy import ocr_server


@pytest.mark.parametrize("target,reading,want", [
    ("Spring Collection 2024", "spring collection 2024", 1.0),
    ("Spring Collection 2024", "SPRING, collectoin 2024!", 2 / 3),   # "collectoin" misread
    ("Step Goal Achieved", "", 0.0),
    ("go go go", "go", 1 / 3),                                          # each read word matches once
    ("\u201cOPEN\u201d now", "open NOW", 1.0),                         # quotes and case ignored
])
def test_word_accuracy_by_hand(target, reading, want):
  assert ocr_metrics.word_accuracy(target, reading) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("target,reading,want", [
    ("Hello World", "hello world", 1.0),
    ("Hello World", "helo world", 1 - 1 / 10),     # one deletion, max(10, 9) = 10
    ("abc", "abcdef", 1 - 3 / 6),                  # three insertions over the longer reading
    ("abc", "", 0.0),
])
def test_ned_by_hand(target, reading, want):
  assert ocr_metrics.ned_similarity(target, reading) == pytest.approx(want, abs=1e-12)


def test_empty_targets_are_errors():
  with pytest.raises(ValueError, match="has no words"):
    ocr_metrics.word_accuracy(" ,, ", "x")
  with pytest.raises(ValueError, match="empty after normalisation"):
    ocr_metrics.ned_similarity("   ", "x")


def test_both_rewards_through_an_ocr_server():
  targets = ["Spring Collection 2024", "Hello World"]
  readings = ["spring collectoin 2024", "helo world"]
  with ocr_server() as (url, seen):
    composer = rewards.RewardComposer([
        {"name": "ocr_word_accuracy", "weight": 1.0, "kwargs": {"url": url, "metadata_keys": ["reading"]}},
        {"name": "ocr_ned", "weight": 0.0, "kwargs": {"url": url, "metadata_keys": ["reading"], "retries": 0}}])
    _, parts = composer(np.zeros((2, 16, 16, 3), np.uint8), ["p1", "p2"],
                        {"reading": np.asarray(readings), "text": np.asarray(targets)})
  np.testing.assert_allclose(parts["ocr_word_accuracy"], [2 / 3, 0.5], atol=1e-6)
  np.testing.assert_allclose(parts["ocr_ned"], [1 - 2 / 20, 1 - 1 / 10], atol=1e-6)
  assert rewards.get("ocr_ned").needs == ("text",)


def test_a_server_that_is_down_is_an_error():
  with pytest.raises(UserError, match="start-up check.*connection failed.*start the server"):
    rewards.RewardComposer([{"name": "ocr_ned", "weight": 1.0,
                             "kwargs": {"url": "http://127.0.0.1:1/score", "retries": 0}}])
