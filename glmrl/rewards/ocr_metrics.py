"""OCR metrics of text rendering, CVTG-2K style, against each prompt's target text `metadata["text"]` (the `ocr`
benchmark carries it), read back by an OCR server (the `text_accuracy` reward's protocol):

- `ocr_word_accuracy`: the fraction of the target's words the reading contains (each reading word matches one
  target word at most: multiset intersection), words lowercased and stripped of surrounding punctuation;
- `ocr_ned`: 1 - normalised edit distance, 1 - d(t, r) / max(len(t), len(r)) of the target and the reading with
  whitespace removed and lowercased (`text_accuracy.normalize_text`); 1 is an exact rendering, 0 nothing alike.

Both are host rewards: evaluation reports them per prompt and category like any reward; a server that is down or
answers garbage is an error (`glmrl.rewards.remote`), never a zero.

    {"name": "ocr_word_accuracy", "weight": 1.0, "kwargs": {"url": "http://127.0.0.1:8001/score"}}
"""

from __future__ import annotations

import collections
import string

import numpy as np

from glmrl.rewards.registry import register_factory
from glmrl.rewards.remote import RemoteRewardClient
from glmrl.rewards.text_accuracy import edit_distance, normalize_text

_STRIP = string.punctuation + "\u201c\u201d\u2018\u2019\u300c\u300d"


def words(text: str) -> list[str]:
  """Lowercased whitespace-separated words, surrounding punctuation stripped, empty ones dropped."""
  return [w for w in (t.strip(_STRIP).lower() for t in text.split()) if w]


def word_accuracy(target: str, reading: str) -> float:
  """|words(target) & words(reading)| / |words(target)| (multisets); ValueError for a target without words."""
  want = collections.Counter(words(target))
  if not want:
    raise ValueError(f"target text {target!r} has no words")
  got = collections.Counter(words(reading))
  return sum((want & got).values()) / sum(want.values())


def ned_similarity(target: str, reading: str) -> float:
  """1 - d / max(len(t), len(r)) of the normalised texts; ValueError for an empty target."""
  t, r = normalize_text(target), normalize_text(reading)
  if not t:
    raise ValueError(f"target text {target!r} is empty after normalisation")
  return 1.0 - edit_distance(t, r) / max(len(t), len(r))


METRICS = {"ocr_word_accuracy": word_accuracy, "ocr_ned": ned_similarity}


def _factory(name: str):
  metric = METRICS[name]

  def factory(url: str, *, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
              max_backoff_s: float = 8.0, chunk_size: int = 8, max_workers: int = 4, metadata_keys=()):
    client = RemoteRewardClient(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                                max_backoff_s=max_backoff_s, chunk_size=chunk_size, max_workers=max_workers,
                                metadata_keys=tuple(metadata_keys))
    client.probe("texts")

    def reward(images, prompts, metadata):
      targets = list((metadata or {}).get("text", ()))
      if len(targets) != np.shape(images)[0]:
        raise ValueError(f"reward {name!r}: {len(targets)} target texts (metadata['text']) for "
                         f"{np.shape(images)[0]} images")
      readings = client.texts(np.asarray(images), list(prompts), metadata)
      return np.asarray([metric(str(t), r) for t, r in zip(targets, readings)], np.float32)

    return reward

  return factory


for _name in METRICS:
  register_factory(_name, _factory(_name), pure_jax=False, needs=("text",))
