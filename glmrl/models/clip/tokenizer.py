"""Host-side CLIP prompt tokenization: fixed length (one compiled text tower), cached per prompt."""

from __future__ import annotations

import collections
import os
from typing import Callable, Sequence

import numpy as np


class PromptTokenizer:
  """`(prompts) -> (input_ids, attention_mask)`, both int32 [B, max_length], right-padded and truncated.

  Padding every prompt to the same length keeps the text tower's input shape static; with causal
  attention and end-token pooling the padding does not change the pooled embedding.
  """

  def __init__(self, tokenizer, max_length: int, cache_size: int = 65536, clean: Callable[[str], str] | None = None):
    """`clean`: the reference's own text cleaning before the tokenizer's (HPS v2.1's is OpenCLIP's)."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
      raise ValueError(f"max_length={max_length!r} must be an int >= 2 (start and end tokens)")
    self.tokenizer = tokenizer
    self.clean = clean
    self.max_length = max_length
    self.cache_size = cache_size
    self._cache: collections.OrderedDict[str, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()

  @classmethod
  def from_pretrained(cls, directory: str, max_length: int, **kwargs) -> "PromptTokenizer":
    """The checkpoint's own tokenizer files (tokenizer.json or vocab.json + merges.txt)."""
    from transformers import CLIPTokenizer

    # from_pretrained on a folder without vocabulary files quietly builds a 3-token tokenizer.
    has = lambda name: os.path.isfile(os.path.join(directory, name))
    if not (has("tokenizer.json") or (has("vocab.json") and has("merges.txt"))):
      raise ValueError(f"no CLIP tokenizer in {directory!r}: it needs tokenizer.json or vocab.json + merges.txt")
    try:
      tokenizer = CLIPTokenizer.from_pretrained(directory)
    except (OSError, ValueError, TypeError) as e:
      raise ValueError(f"no CLIP tokenizer in {directory!r} (tokenizer.json or vocab.json + merges.txt): {e}") from e
    return cls(tokenizer, max_length, **kwargs)

  def _encode(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
    hit = self._cache.get(prompt)
    if hit is not None:
      self._cache.move_to_end(prompt)
      return hit
    text = self.clean(prompt) if self.clean is not None else prompt
    enc = self.tokenizer(text, padding="max_length", truncation=True, max_length=self.max_length)
    ids = np.asarray(enc["input_ids"], np.int32)
    mask = np.asarray(enc["attention_mask"], np.int32)
    if ids.shape != (self.max_length,):
      raise ValueError(f"tokenizer returned {ids.shape[0]} ids for {prompt!r}, expected {self.max_length}")
    self._cache[prompt] = (ids, mask)
    if len(self._cache) > self.cache_size:
      self._cache.popitem(last=False)
    return ids, mask

  def __call__(self, prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
      raise ValueError(f"prompts must be a sequence of strings, got {prompts!r}")
    if not prompts:
      raise ValueError("prompts is empty")
    pairs = [self._encode(p) for p in prompts]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
