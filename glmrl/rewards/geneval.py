"""GenEval's rules (Ghosh et al. 2023, arXiv:2310.11513; github.com/djghosh13/geneval, evaluation/
evaluate_images.py), written from its definitions, over the detections an object detector serves remotely
(`RemoteRewardClient.detections`: per image {"class", "score", "box": [x0, y0, x1, y1], "color"}).

Detections are kept per class by confidence: above `threshold` (0.3), or `counting_threshold` (0.9) for the
"counting" category, at most `max_objects` (16) per class, most confident first (GenEval's default applies no
non-maximum suppression). A prompt's metadata lists `include` clauses (all must hold) and `exclude` clauses (none
may): an include clause {"class", "count"[, "color"][, "position": [relation, clause index]]} holds when the class
has at least `count` kept detections; then, with a colour, at least `count` of the `count` most confident are that
colour; with a position, each of them stands in `relation` ("left of", "right of", "above", "below") to every
object the referenced (earlier) clause matched. An exclude clause {"class", "count"} fails when the class has at
least `count` kept detections. Relations: the centres' offset, each axis shrunk towards 0 by
`position_threshold` (0.1) x the two boxes' summed extent on that axis; none when both shrink to 0; else
normalised by the offset's length, an axis component below -0.5 / above 0.5 gives left of / right of (x) and
above / below (y, image coordinates).

The detector (Mask2Former on COCO's 80 classes, and CLIP ViT-L/14 zero-shot over GenEval's colours on each
box's crop, as evaluate_images.py runs them) is served by `python -m glmrl.rewards.server
--scorer=<your module>:detect`, where `detect(images, prompts, metadata)` returns each image's detections; glmrl
does not ship its weights. The `geneval` reward scores an image 1 if every clause holds, else 0.
"""

from __future__ import annotations

import numpy as np

from glmrl.rewards.registry import register_factory
from glmrl.rewards.remote import RemoteRewardClient

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")
THRESHOLD, COUNTING_THRESHOLD, MAX_OBJECTS, POSITION_THRESHOLD = 0.3, 0.9, 16, 0.1


def kept(detections: list[dict], category: str, *, threshold: float = THRESHOLD,
         counting_threshold: float = COUNTING_THRESHOLD, max_objects: int = MAX_OBJECTS) -> dict[str, list[dict]]:
  """{class: its detections above the category's confidence threshold, most confident first, at most
  max_objects}."""
  cut = counting_threshold if category == "counting" else threshold
  out: dict[str, list[dict]] = {}
  for d in sorted(detections, key=lambda d: -d["score"]):
    if d["score"] > cut and len(out.setdefault(d["class"], [])) < max_objects:
      out[d["class"]].append(d)
  return {k: v for k, v in out.items() if v}


def relations(box_a, box_b, position_threshold: float = POSITION_THRESHOLD) -> set[str]:
  """Where box A stands relative to box B ([x0, y0, x1, y1] each; see the module docstring)."""
  a, b = np.asarray(box_a, np.float64).reshape(2, 2), np.asarray(box_b, np.float64).reshape(2, 2)
  offset = a.mean(axis=0) - b.mean(axis=0)
  extent = np.abs(a[1] - a[0]) + np.abs(b[1] - b[0])
  shrunk = np.maximum(np.abs(offset) - position_threshold * extent, 0.0) * np.sign(offset)
  if np.all(np.abs(shrunk) < 1e-3):
    return set()
  dx, dy = shrunk / np.linalg.norm(offset)
  out = set()
  if dx < -0.5:
    out.add("left of")
  if dx > 0.5:
    out.add("right of")
  if dy < -0.5:
    out.add("above")
  if dy > 0.5:
    out.add("below")
  return out


def evaluate(objects: dict[str, list[dict]], metadata: dict,
             position_threshold: float = POSITION_THRESHOLD) -> tuple[bool, list[str]]:
  """(whether every clause of `metadata` holds for the kept `objects`, the reasons of those that do not)."""
  correct, reasons, matched = True, [], []
  for clause in metadata.get("include", []):
    name, count = clause["class"], clause["count"]
    found = objects.get(name, [])[:count]
    ok = len(found) >= count
    if not ok:
      reasons.append(f"expected {name} >= {count}, found {len(found)}")
    if ok and "color" in clause:
      colors = [d.get("color") for d in found]
      if colors.count(clause["color"]) < count:
        ok = False
        reasons.append(f"expected {count} {clause['color']} {name}, found colours {colors}")
    if ok and "position" in clause:
      relation, target = clause["position"]
      targets = matched[target] if target < len(matched) else None
      if targets is None:
        ok = False
        reasons.append(f"no {name} target to be {relation}")
      elif not all(relation in relations(d["box"], t["box"], position_threshold) for d in found for t in targets):
        ok = False
        reasons.append(f"expected {name} {relation} its target")
    matched.append(found if ok else None)
    correct = correct and ok
  for clause in metadata.get("exclude", []):
    n = len(objects.get(clause["class"], []))
    if n >= clause["count"]:
      correct = False
      reasons.append(f"expected {clause['class']} < {clause['count']}, found {n}")
  return correct, reasons


def geneval_factory(url: str, *, timeout_s: float = 120.0, retries: int = 3, backoff_s: float = 0.5,
                    max_backoff_s: float = 8.0, chunk_size: int = 8, max_workers: int = 4):
  """A host-side reward fn(images, prompts, metadata): 1.0 where the image satisfies its prompt's GenEval clauses
  (metadata "category", "include", "exclude"), else 0.0."""
  client = RemoteRewardClient(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                              max_backoff_s=max_backoff_s, chunk_size=chunk_size, max_workers=max_workers)
  client.probe("detections")

  def geneval_reward(images, prompts, metadata):
    n = np.shape(images)[0]
    includes = list((metadata or {}).get("include", ()))
    if len(includes) != n:
      raise ValueError(f"reward 'geneval': {len(includes)} GenEval clauses (metadata['include']) for {n} images")
    categories = list(metadata.get("category", [""] * n))
    excludes = list(metadata.get("exclude", [[]] * n))
    detections = client.detections(np.asarray(images), list(prompts))
    return np.asarray([float(evaluate(kept(d, str(c)), {"include": inc, "exclude": exc or []})[0])
                       for d, c, inc, exc in zip(detections, categories, includes, excludes)], np.float32)

  return geneval_reward


register_factory("geneval", geneval_factory, pure_jax=False, needs=("include",))
