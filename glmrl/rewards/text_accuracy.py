"""Text accuracy: how well an image renders its prompt's quoted texts, read back by an OCR server.

Flow-GRPO's OCR reward (flow_grpo/ocr.py) takes the first "double-quoted" span t of the prompt and
the OCR text r of the image (PaddleOCR lines with confidence > 0 joined with ''), removes spaces
from both and lowercases them, and scores 1 - d / len(t) with d = 0 if t is a substring of r, else
the Levenshtein distance between r and t, capped at len(t) (so many unrelated characters cost no
more than reading nothing). Implemented here, per prompt:

- expected texts (`targets`): "glyphs" (default), every quoted span, from
  `glmrl.models.glyph.extract_glyph_texts` (the pipeline's own extraction: 'single', \u201ccurly\u201d,
  "straight" and \u300ccorner\u300d quotes); "flow_grpo", Flow-GRPO's rule, the text between the prompt's first
  two straight double quotes (`prompt.split('"')[1]`). `A bakery's sign "OPEN", it's` holds one target by
  Flow-GRPO's rule and two by the glyphs' (the apostrophes quote "s sign \"OPEN\", it"). Texts empty after
  normalisation are skipped;
- normalisation: all whitespace removed and str.lower() (Flow-GRPO removes ' ' only; this differs
  only for other whitespace, e.g. newlines between the lines of a server's reading);
- `match="flow_grpo"` (default): Flow-GRPO's d above, for each text against the whole reading;
  `match="substring"`: d = the least edit distance between t and any substring of r (semi-global
  alignment; <= len(t) by construction), which does not charge one text for the others a
  multi-text prompt puts in the same image;
- the prompt's reward: the mean of 1 - d / len(t) over its texts, in [0, 1]. A prompt without
  quoted text raises ValueError unless `no_text_score` gives its reward (such images are not sent).

The reading comes from a reward server whose scorer returns texts (`glmrl.rewards.server`); a
server failure raises (Flow-GRPO gave the maximum penalty on OCR exceptions).

    {"name": "text_accuracy", "weight": 1.0,
     "kwargs": {"url": "http://127.0.0.1:8001/score", "match": "flow_grpo", "targets": "glyphs"}}
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from glmrl.models.glyph import extract_glyph_texts
from glmrl.rewards.registry import register_factory
from glmrl.rewards.remote import RemoteRewardClient

MATCHES = ("flow_grpo", "substring")
TARGETS = ("glyphs", "flow_grpo")


def edit_distance(a: str, b: str) -> int:
  """Levenshtein distance (unit-cost insertions, deletions, substitutions)."""
  if len(a) < len(b):
    a, b = b, a
  prev = list(range(len(b) + 1))
  for i, ca in enumerate(a, 1):
    cur = [i]
    for j, cb in enumerate(b, 1):
      cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
    prev = cur
  return prev[-1]


def substring_edit_distance(pattern: str, text: str) -> int:
  """min over substrings s of `text` of edit_distance(pattern, s) (free start and end in `text`)."""
  # prev[j]: cost of aligning the pattern prefix so far with a substring of text ending at j.
  prev = [0] * (len(text) + 1)
  for i, cp in enumerate(pattern, 1):
    cur = [i]
    for j, ct in enumerate(text, 1):
      cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (cp != ct)))
    prev = cur
  return min(prev)


def normalize_text(text: str) -> str:
  """Whitespace removed, lowercased."""
  return "".join(text.split()).lower()


def text_score(expected: str, reading: str, match: str = "flow_grpo") -> float:
  """1 - d / len(expected) in [0, 1], both texts normalised first; see the module doc for d."""
  if match not in MATCHES:
    raise ValueError(f"match={match!r} must be one of {MATCHES}")
  t, r = normalize_text(expected), normalize_text(reading)
  if not t:
    raise ValueError(f"expected text {expected!r} is empty after normalisation")
  if match == "substring":
    d = substring_edit_distance(t, r)
  else:
    d = 0 if t in r else min(edit_distance(r, t), len(t))
  return 1.0 - d / len(t)


def expected_texts(prompt: str, targets: str = "glyphs") -> list[str]:
  """The prompt's quoted texts by the `targets` rule (see the module doc) that are non-empty after normalisation."""
  if targets not in TARGETS:
    raise ValueError(f"targets={targets!r} must be one of {TARGETS}")
  if targets == "glyphs":
    texts = extract_glyph_texts(prompt)
  else:
    spans = prompt.split('"')
    texts = spans[1:2]
  return [t for t in texts if normalize_text(t)]


def text_accuracy(prompts: Sequence[str], readings: Sequence[str | None], *, match: str = "flow_grpo",
                  no_text_score: float | None = None, targets: str = "glyphs") -> np.ndarray:
  """float32 [B]: mean text_score over each prompt's texts; `readings[i]` may be None for a prompt
  without texts (scored `no_text_score`)."""
  if len(prompts) != len(readings):
    raise ValueError(f"{len(prompts)} prompts but {len(readings)} readings")
  out = []
  for prompt, reading in zip(prompts, readings):
    texts = expected_texts(prompt, targets)
    if not texts:
      if no_text_score is None:
        raise ValueError(f"prompt {prompt!r} has no quoted text to check (set no_text_score to score such prompts)")
      out.append(no_text_score)
    else:
      out.append(float(np.mean([text_score(t, reading, match) for t in texts])))
  return np.asarray(out, np.float32)


def text_accuracy_factory(url: str, *, match: str = "flow_grpo", no_text_score: float | None = None,
                          targets: str = "glyphs", timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
                          max_backoff_s: float = 8.0, chunk_size: int = 8, max_workers: int = 4,
                          metadata_keys: Sequence[str] = ()):
  """A host-side reward fn(images, prompts, metadata) scoring the OCR server's readings."""
  if match not in MATCHES:
    raise ValueError(f"reward 'text_accuracy': match={match!r} must be one of {MATCHES}")
  if targets not in TARGETS:
    raise ValueError(f"reward 'text_accuracy': targets={targets!r} must be one of {TARGETS}")
  if no_text_score is not None and (isinstance(no_text_score, bool)
                                    or not isinstance(no_text_score, (int, float))
                                    or not np.isfinite(no_text_score)):
    raise ValueError(f"reward 'text_accuracy': no_text_score={no_text_score!r} must be a finite number or None")
  client = RemoteRewardClient(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                              max_backoff_s=max_backoff_s, chunk_size=chunk_size, max_workers=max_workers,
                              metadata_keys=tuple(metadata_keys))
  client.probe("texts")

  def text_accuracy_reward(images, prompts, metadata):
    if isinstance(prompts, str) or prompts is None:
      raise ValueError(f"reward 'text_accuracy': prompts must be a list of strings, got {prompts!r:.200}")
    if len(prompts) != np.shape(images)[0]:
      raise ValueError(f"reward 'text_accuracy': {len(prompts)} prompts for {np.shape(images)[0]} images")
    has_text = [bool(expected_texts(p, targets)) for p in prompts]
    missing = [p for p, h in zip(prompts, has_text) if not h]
    if missing and no_text_score is None:
      raise ValueError(f"reward 'text_accuracy': prompt(s) {missing[:3]!r} have no quoted text to check "
                       "(set no_text_score to score such prompts)")
    rows = [i for i, h in enumerate(has_text) if h]
    readings: list[str | None] = [None] * len(prompts)
    if rows:
      images = np.asarray(images)
      sub_meta = {k: [metadata[k][i] for i in rows] for k in client.metadata_keys if metadata and k in metadata}
      for i, reading in zip(rows, client.texts(images[rows], [prompts[i] for i in rows], sub_meta)):
        readings[i] = reading
    return text_accuracy(prompts, readings, match=match, no_text_score=no_text_score, targets=targets)

  return text_accuracy_reward


register_factory("text_accuracy", text_accuracy_factory, pure_jax=False)
