"""Host-side prompt tokenization: the checkpoint folder's CLIPTokenizer, fixed length, cached."""

import glmrl  # noqa: F401

import numpy as np
import pytest

from glmrl.models.clip.tokenizer import PromptTokenizer
from tests.models.clip import tiny


class CountingTokenizer:
  def __init__(self, inner):
    self.inner, self.calls = inner, []

  def __call__(self, text, **kwargs):
    self.calls.append(text)
    return self.inner(text, **kwargs)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok")
  tiny.tiny_tokenizer().save_pretrained(str(path))
  return path


def test_matches_clip_tokenizer_padded_and_truncated(folder):
  tok = PromptTokenizer.from_pretrained(str(folder), max_length=16)
  prompts = ["a photo of the cat and dog", "The DOG", "x" * 40]
  ids, mask = tok(prompts)
  want = tiny.tiny_tokenizer()(prompts, padding="max_length", truncation=True, max_length=16)
  assert ids.dtype == mask.dtype == np.int32 and ids.shape == mask.shape == (3, 16)
  np.testing.assert_array_equal(ids, want["input_ids"])
  np.testing.assert_array_equal(mask, want["attention_mask"])
  assert ids[2, -1] == tiny.EOS_ID and mask[2].all()  # truncation keeps the end token
  assert ids[1, 0] == tiny.EOS_ID - 1 and (ids[1, 4:] == tiny.EOS_ID).all()


def test_each_prompt_is_tokenized_once(folder):
  inner = CountingTokenizer(tiny.tiny_tokenizer())
  tok = PromptTokenizer(inner, max_length=16, cache_size=2)
  a, _ = tok(["cat", "dog", "cat"])
  b, _ = tok(["dog", "cat"])
  assert inner.calls == ["cat", "dog"]
  np.testing.assert_array_equal(a[[1, 0]], b)
  tok(["the"])  # evicts the least recently used ("dog")
  tok(["dog"])
  assert inner.calls == ["cat", "dog", "the", "dog"]


def test_errors(folder, tmp_path):
  tok = PromptTokenizer.from_pretrained(str(folder), max_length=16)
  with pytest.raises(ValueError, match="sequence of strings"):
    tok("a cat")
  with pytest.raises(ValueError, match="empty"):
    tok([])
  with pytest.raises(ValueError, match="max_length=1"):
    PromptTokenizer(tiny.tiny_tokenizer(), max_length=1)
  with pytest.raises(ValueError, match="no CLIP tokenizer"):
    PromptTokenizer.from_pretrained(str(tmp_path), max_length=16)
