"""One detection of the reward server's `detections` answer, checked as JSON types on both ends: the server checks
its scorer's output, the client (`glmrl.rewards.remote`) the server's answer. Its own module so that the client does
not import the server (`python -m glmrl.rewards.server` would then find itself imported by the package first)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def check_detection(d: Any, where: str) -> dict:
  """One detection as JSON types: {"class", "score", "box"[, "color"]}; ValueError naming `where` otherwise."""
  if not isinstance(d, dict) or not isinstance(d.get("class"), str) or not d["class"]:
    raise ValueError(f"{where} = {d!r:.200} must be a dict with a non-empty 'class' string")
  score, box = d.get("score"), d.get("box")
  if isinstance(score, np.generic):
    score = score.item()
  if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
    raise ValueError(f"{where}: score={score!r:.100} is not a finite number")
  if isinstance(box, np.ndarray):
    box = box.tolist()
  if not isinstance(box, (list, tuple)) or len(box) != 4 or not all(
      not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) for x in box):
    raise ValueError(f"{where}: box={box!r:.100} must be 4 finite numbers [x0, y0, x1, y1]")
  out = {"class": d["class"], "score": float(score), "box": [float(x) for x in box]}
  if "color" in d:
    if not isinstance(d["color"], str):
      raise ValueError(f"{where}: color={d['color']!r:.100} is not a string")
    out["color"] = d["color"]
  return out
