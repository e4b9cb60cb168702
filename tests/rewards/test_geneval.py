"""GenEval's rules on hand-made detections (each rule holding and failing at least once), its relative positions,
and the `geneval` reward through the reference server with a scripted detector on loopback: a detector that is
down, slow or answers garbage is an error naming it, never a silent zero."""

import glmrl  # noqa: F401

import contextlib
import threading
import time

import numpy as np
import pytest

from glmrl import rewards
from glmrl.errors import UserError
from glmrl.rewards import geneval
from glmrl.rewards import server as server_lib
from glmrl.rewards.remote import RemoteRewardError


def det(cls, score=0.95, box=(0, 0, 10, 10), color=None):
  d = {"class": cls, "score": score, "box": list(box)}
  if color:
    d["color"] = color
  return d


def holds(detections, metadata):
  return geneval.evaluate(geneval.kept(detections, metadata.get("category", "")), metadata)[0]


CASES = [  # (category, clauses, detections, holds)
    ("single_object", {"include": [{"class": "cat", "count": 1}]}, [det("cat")], True),
    ("single_object", {"include": [{"class": "cat", "count": 1}]}, [det("cat", score=0.2)], False),  # under 0.3
    ("two_object", {"include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}]},
     [det("cat"), det("dog", 0.5)], True),
    ("two_object", {"include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}]}, [det("cat")], False),
    ("counting", {"include": [{"class": "cup", "count": 2}], "exclude": [{"class": "cup", "count": 3}]},
     [det("cup"), det("cup"), det("cup", 0.5)], True),   # the third is under counting's 0.9
    ("counting", {"include": [{"class": "cup", "count": 2}], "exclude": [{"class": "cup", "count": 3}]},
     [det("cup"), det("cup"), det("cup", 0.92)], False),  # three: the exclude clause fails
    ("colors", {"include": [{"class": "car", "count": 1, "color": "red"}]}, [det("car", color="red")], True),
    ("colors", {"include": [{"class": "car", "count": 1, "color": "red"}]},
     [det("car", 0.99, color="blue"), det("car", 0.5, color="red")], False),  # only the most confident is looked at
    ("color_attr", {"include": [{"class": "bag", "count": 1, "color": "pink"},
                                {"class": "scissors", "count": 1, "color": "black"}]},
     [det("bag", color="pink"), det("scissors", color="black")], True),
    ("color_attr", {"include": [{"class": "bag", "count": 1, "color": "pink"},
                                {"class": "scissors", "count": 1, "color": "black"}]},
     [det("bag", color="black"), det("scissors", color="pink")], False),
    ("position", {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1,
                                                            "position": ["left of", 0]}]},
     [det("dog", box=(60, 0, 90, 30)), det("cat", box=(0, 0, 30, 30))], True),
    ("position", {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1,
                                                            "position": ["left of", 0]}]},
     [det("dog", box=(0, 0, 30, 30)), det("cat", box=(60, 0, 90, 30))], False),
    ("position", {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1,
                                                            "position": ["above", 0]}]},
     [det("cat", box=(0, 0, 30, 30))], False),  # no dog: no target
]


@pytest.mark.parametrize("category,clauses,detections,want", CASES)
def test_rules(category, clauses, detections, want):
  assert holds(detections, {"category": category, **clauses}) is want


def test_relations_shrink_overlapping_offsets_to_none():
  assert geneval.relations((0, 0, 10, 10), (50, 0, 60, 10)) == {"left of"}
  assert geneval.relations((0, 50, 10, 60), (0, 0, 10, 10)) == {"below"}  # image y grows downwards
  assert geneval.relations((0, 0, 10, 10), (40, 40, 50, 50)) == {"left of", "above"}  # diagonal: both, 0.67 each
  assert geneval.relations((0, 0, 10, 10), (40, 15, 50, 25)) == {"left of"}  # (-38, -13) / 42.3: y at -0.31
  # Centres 1 apart, boxes 10 wide: the offset shrinks by 0.1 x 20 = 2 to 0.
  assert geneval.relations((0, 0, 10, 10), (1, 0, 11, 10)) == set()


def test_at_most_max_objects_per_class_are_kept():
  objects = geneval.kept([det("cup", 0.95 - i * 0.001) for i in range(20)], "single_object")
  assert len(objects["cup"]) == geneval.MAX_OBJECTS
  assert objects["cup"][0]["score"] == 0.95


@contextlib.contextmanager
def detector(answer, delay=0.0):
  """The reference server with a scripted detector: `answer(metadata)` per image."""
  def detect(images, prompts, metadata):
    time.sleep(delay)
    return [answer(i) for i in range(len(images))]

  server = server_lib.RewardServer(detect, port=0)
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
  thread.start()
  try:
    yield server.url
  finally:
    server.shutdown()
    server.server_close()


def metadata():
  return {"category": ["single_object", "colors"],
          "include": [[{"class": "cat", "count": 1}], [{"class": "car", "count": 1, "color": "red"}]],
          "exclude": [None, None]}


def test_reward_through_a_detector_server():
  answers = [[det("cat")], [det("car", color="blue")]]
  with detector(lambda i: answers[i]) as url:
    fn = rewards.get("geneval").build(url=url, retries=0).fn
    np.testing.assert_array_equal(fn(np.zeros((2, 16, 16, 3), np.uint8), ["a cat", "a red car"], metadata()),
                                  [1.0, 0.0])


def test_down_slow_and_garbage_detectors_are_errors():
  # Each found when the reward is built, by its start-up request.
  with pytest.raises(UserError, match="start-up check.*connection failed.*start the server"):
    rewards.get("geneval").build(url="http://127.0.0.1:1/score", retries=0)
  with detector(lambda i: [det("cat")], delay=1.0) as url:
    with pytest.raises(RemoteRewardError, match="timed out"):
      rewards.get("geneval").build(url=url, timeout_s=0.2, retries=0)
  with detector(lambda i: [{"class": "cat", "score": "high", "box": [0, 0, 1, 1]}]) as url:
    with pytest.raises(RemoteRewardError, match="score='high' is not a finite number"):
      rewards.get("geneval").build(url=url, retries=0)
