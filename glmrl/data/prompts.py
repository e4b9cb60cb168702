"""Prompt files: `.txt` (one prompt per line) or `.jsonl` records, validated eagerly.

A `.jsonl` line is an object with `prompt` (required, non-empty string) and the
optional fields `target_image` (path), `source_images` (list of paths) and
`metadata` (object handed to the rewards). Relative paths resolve against the
prompt file's directory. Blank lines are skipped in both formats. Every problem
raises a PromptFileError (a ValueError) naming the file and the 1-based line, before any training.
"""

import dataclasses
import json
import os
import unicodedata
from typing import Any, Mapping

import numpy as np
from PIL import Image

from glmrl.errors import UserError

FIELDS = ("prompt", "target_image", "source_images", "metadata")
# Keys the batched metadata already uses for the loaded images.
RESERVED_METADATA_KEYS = ("target_image", "source_images")


class PromptFileError(UserError):
  """A prompt file (or an image it names) is unreadable or malformed; the message names file:line."""


@dataclasses.dataclass(frozen=True)
class PromptRecord:
  """One prompt with the paths of its optional images, already validated."""
  prompt: str
  line: int
  target_image: str | None = None
  source_images: tuple[str, ...] = ()
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def check_image_size(height: int, width: int) -> None:
  """GLM-Image generates sizes divisible by 32."""
  for name, value in (("height", height), ("width", width)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0 or value % 32:
      raise ValueError(f"{name}={value!r} must be a positive multiple of 32")


def load_image(path: str, height: int, width: int) -> np.ndarray:
  """Reads an image as uint8 [height, width, 3] RGB, resized (bicubic) when its size differs."""
  check_image_size(height, width)
  with Image.open(path) as im:
    im = im.convert("RGB")
    if im.size != (width, height):
      im = im.resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(im, dtype=np.uint8).copy()


def load_prompts(path: str | os.PathLike) -> list[PromptRecord]:
  """Loads and validates every record of a `.txt` or `.jsonl` prompt file."""
  path = os.fspath(path)
  ext = os.path.splitext(path)[1].lower()
  if ext not in (".txt", ".jsonl"):
    raise PromptFileError(f"{path}: unsupported prompt file extension {ext!r} (expected .txt or .jsonl)")
  try:
    with open(path, "rb") as f:
      raw_lines = f.read().splitlines()
  except OSError as e:
    raise PromptFileError(f"{path}: cannot read prompt file: {e}") from e

  base_dir = os.path.dirname(os.path.abspath(path))
  records = []
  for lineno, raw in enumerate(raw_lines, start=1):
    where = f"{path}:{lineno}"
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise PromptFileError(f"{where}: not valid UTF-8: {e}") from e
    if lineno == 1:
      text = text.removeprefix("\ufeff")
    if not text.strip():
      continue
    if ext == ".txt":
      records.append(PromptRecord(prompt=_checked_text(text.strip(), where), line=lineno))
    else:
      records.append(_parse_json_line(text, where, lineno, base_dir))
  if not records:
    raise PromptFileError(f"{path}: prompt file is empty (no non-blank lines)")
  _check_consistent_targets(path, records)
  return records


def _parse_json_line(text: str, where: str, lineno: int, base_dir: str) -> PromptRecord:
  try:
    obj = json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, where))
  except json.JSONDecodeError as e:
    raise PromptFileError(f"{where}: bad JSON: {e}") from e
  if not isinstance(obj, dict):
    raise PromptFileError(f"{where}: expected a JSON object, got {type(obj).__name__}")
  unknown = sorted(set(obj) - set(FIELDS))
  if unknown:
    raise PromptFileError(f"{where}: unknown field(s) {unknown}; allowed fields are {list(FIELDS)}")
  if "prompt" not in obj:
    raise PromptFileError(f"{where}: missing required field 'prompt'")
  prompt = obj["prompt"]
  if not isinstance(prompt, str):
    raise PromptFileError(f"{where}: 'prompt' must be a string, got {type(prompt).__name__}")
  if not prompt.strip():
    raise PromptFileError(f"{where}: 'prompt' is empty")
  _checked_text(prompt, where)

  target = obj.get("target_image")
  if target is not None:
    if not isinstance(target, str):
      raise PromptFileError(f"{where}: 'target_image' must be a string path, got {type(target).__name__}")
    target = _checked_image_path(target, base_dir, where, "target_image")

  sources = obj.get("source_images", [])
  if not isinstance(sources, list):
    raise PromptFileError(f"{where}: 'source_images' must be a list of string paths, got {type(sources).__name__}")
  checked_sources = []
  for i, src in enumerate(sources):
    if not isinstance(src, str):
      raise PromptFileError(f"{where}: 'source_images'[{i}] must be a string path, got {type(src).__name__}")
    checked_sources.append(_checked_image_path(src, base_dir, where, f"source_images[{i}]"))

  metadata = obj.get("metadata", {})
  if not isinstance(metadata, dict):
    raise PromptFileError(f"{where}: 'metadata' must be a JSON object, got {type(metadata).__name__}")
  reserved = sorted(set(metadata) & set(RESERVED_METADATA_KEYS))
  if reserved:
    raise PromptFileError(f"{where}: metadata key(s) {reserved} are reserved for the loaded images")

  return PromptRecord(prompt=prompt.strip(), line=lineno, target_image=target,
                      source_images=tuple(checked_sources), metadata=metadata)


def _unique_keys(pairs: list, where: str) -> dict:
  """A JSON object's pairs as a dict; a key given twice would keep only its last value silently."""
  keys = [k for k, _ in pairs]
  twice = sorted({k for k in keys if keys.count(k) > 1})
  if twice:
    raise PromptFileError(f"{where}: key(s) {twice} given more than once in one object")
  return dict(pairs)


def _checked_text(prompt: str, where: str) -> str:
  """A prompt without control characters other than tab and newline (a NUL or an escape code is never meant)."""
  bad = sorted({c for c in prompt if unicodedata.category(c) == "Cc" and c not in "\t\n"})
  if bad:
    at = min(prompt.index(c) for c in bad)
    raise PromptFileError(f"{where}: the prompt holds control character(s) {', '.join(repr(c) for c in bad)} "
                          f"(first at character {at}: {prompt[max(0, at - 20):at + 1]!r})")
  return prompt


def _checked_image_path(rel: str, base_dir: str, where: str, field: str) -> str:
  full = os.path.normpath(os.path.join(base_dir, os.path.expanduser(rel)))
  if os.path.isdir(full):
    raise PromptFileError(f"{where}: {field} {rel!r} is a folder ({full}); name one image file")
  if not os.path.isfile(full):
    raise PromptFileError(f"{where}: {field} {rel!r} not found (resolved to {full})")
  try:
    with Image.open(full) as im:
      im.verify()
  except Exception as e:  # PIL raises many exception types for corrupt files.
    raise PromptFileError(f"{where}: {field} {rel!r} is not a readable image ({full}): {e}") from e
  return full


def _check_consistent_targets(path: str, records: list[PromptRecord]) -> None:
  # Batched target images need a value for every row, so all lines or none have one.
  with_target = [r.target_image is not None for r in records]
  if any(with_target) and not all(with_target):
    first_missing = records[with_target.index(False)].line
    raise PromptFileError(f"{path}:{first_missing}: 'target_image' is missing here but given on other lines; "
                     "give it on every line or on none")
