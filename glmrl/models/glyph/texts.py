"""Glyph texts of a prompt -> ByT5 tokens -> glyph embeddings, as GlmImagePipeline does it.

Reference behaviour reproduced (diffusers `GlmImagePipeline.get_glyph_texts` / `_get_glyph_embeds`):
- the glyph texts of a prompt are its quoted spans, collected per quote kind in this order:
  'single', \u201ccurly double\u201d, "straight double", \u300ccorner brackets\u300d;
  a prompt without any gets the single text "" (which tokenizes to just </s>);
- each text is tokenized by ByT5 (bytes + </s>, truncated to `max_sequence_length`);
- when a prompt has an even number of texts, every text of that prompt gets one <pad> token
  prepended, and that token counts as a real token (mask 1);
- the encoder runs on the prompt's texts right-padded to a common length; the embeddings of the
  real tokens of all texts, in order, are concatenated into one sequence per prompt;
- the sequences of a batch are left-padded with zeros to the longest.

Here all texts of all prompts go through the encoder as one [T, L] batch; `GlyphTokens` holds the
host-computed gather map from that batch to the [B, S, D] glyph embeddings, so the device side
(`pack_glyph_embeds`) has static shapes and jits. Right-padding more (`pad_length_to`,
`pad_texts_to`) leaves the embeddings unchanged; left-padding the sequence beyond the longest
prompt (`pad_seq_to`) changes what the DiT sees, since the reference passes no glyph mask to it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

# (opening, closing) quote pairs in the order the reference concatenates their matches.
QUOTE_PAIRS = (("'", "'"), ("\u201c", "\u201d"), ('"', '"'), ("\u300c", "\u300d"))


@functools.lru_cache(maxsize=None)
def _quote_patterns():
  pats = []
  for open_q, close_q in QUOTE_PAIRS:
    banned = re.escape("".join(sorted({open_q, close_q})))
    pats.append(re.compile(f"{re.escape(open_q)}([^{banned}]*){re.escape(close_q)}"))
  return tuple(pats)


def extract_glyph_texts(prompt: str) -> list[str]:
  """Quoted spans of `prompt` (may be empty), in the reference's order."""
  if not isinstance(prompt, str):
    raise ValueError(f"prompt must be a str, got {type(prompt).__name__}: {prompt!r}")
  return [span for pat in _quote_patterns() for span in pat.findall(prompt)]


@functools.lru_cache(maxsize=1)
def default_tokenizer():
  """transformers' ByT5Tokenizer (needs no vocabulary files)."""
  from transformers import ByT5Tokenizer
  return ByT5Tokenizer()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GlyphTokens:
  """Encoder inputs for a batch of prompts and the map back to per-prompt sequences.

  A pytree of arrays, so it can be passed to jitted functions."""
  input_ids: np.ndarray       # [T, L] int32, every glyph text of every prompt, right-padded
  attention_mask: np.ndarray  # [T, L] int32
  gather_index: np.ndarray    # [B, S] int32 index into the encoder output flattened to [T * L]
  gather_mask: np.ndarray     # [B, S] bool, False on the (left) padding
  text_counts: np.ndarray     # [B] int32, encoder rows used by each prompt

  @property
  def lengths(self) -> np.ndarray:
    """[B] number of glyph tokens of each prompt."""
    return np.asarray(self.gather_mask).sum(axis=1).astype(np.int32)


def _padded(n: int, pad_to: int | None, name: str) -> int:
  if pad_to is None:
    return n
  if pad_to < n:
    raise ValueError(f"{name}={pad_to} is smaller than the {n} this batch needs")
  return pad_to


def tokenize_glyph_texts(
    prompts: str | Sequence[str],
    tokenizer=None,
    *,
    max_sequence_length: int = 2048,
    pad_texts_to: int | None = None,
    pad_length_to: int | None = None,
    pad_seq_to: int | None = None,
) -> GlyphTokens:
  """Host-side tokenization of the glyph texts of `prompts` (see the module docstring)."""
  if isinstance(prompts, str):
    prompts = [prompts]
  if len(prompts) == 0:
    raise ValueError("prompts is empty")
  if max_sequence_length < 1:
    raise ValueError(f"max_sequence_length={max_sequence_length} must be >= 1")
  tokenizer = default_tokenizer() if tokenizer is None else tokenizer
  pad_id = tokenizer.pad_token_id

  rows, counts = [], []
  for prompt in prompts:
    texts = extract_glyph_texts(prompt) or [""]
    ids = tokenizer(texts, max_length=max_sequence_length, truncation=True)["input_ids"]
    # Reference quirk: the parity test is on the number of texts, not on each text's length.
    prefix = [pad_id] * ((len(ids) + 1) % 2)
    rows.extend(prefix + list(r) for r in ids)
    counts.append(len(ids))

  num_texts = _padded(len(rows), pad_texts_to, "pad_texts_to")
  length = _padded(max(len(r) for r in rows), pad_length_to, "pad_length_to")
  input_ids = np.full((num_texts, length), pad_id, np.int32)
  attention_mask = np.zeros((num_texts, length), np.int32)
  for t, r in enumerate(rows):
    input_ids[t, :len(r)] = r
    attention_mask[t, :len(r)] = 1

  per_prompt, t = [], 0
  for c in counts:
    per_prompt.append(np.concatenate([t_ * length + np.arange(len(rows[t_]))
                                      for t_ in range(t, t + c)]))
    t += c
  seq = _padded(max(len(ix) for ix in per_prompt), pad_seq_to, "pad_seq_to")
  gather_index = np.zeros((len(prompts), seq), np.int32)
  gather_mask = np.zeros((len(prompts), seq), bool)
  for b, ix in enumerate(per_prompt):
    gather_index[b, seq - len(ix):] = ix
    gather_mask[b, seq - len(ix):] = True
  return GlyphTokens(input_ids, attention_mask, gather_index, gather_mask,
                     np.asarray(counts, np.int32))


def pack_glyph_embeds(hidden_YxLxD, gather_index_BxS, gather_mask_BxS):
  """Encoder output [T, L, D] -> glyph embeddings [B, S, D], zeros on the left padding (jit-able)."""
  t, l, d = hidden_YxLxD.shape
  flat_YLxD = hidden_YxLxD.reshape(t * l, d)
  out_BxSxD = jnp.take(flat_YLxD, jnp.asarray(gather_index_BxS), axis=0)
  return jnp.where(jnp.asarray(gather_mask_BxS)[..., None], out_BxSxD, jnp.zeros((), out_BxSxD.dtype))


def encode_glyph_embeds(encoder, tokens: GlyphTokens):
  """Run the T5 encoder on `tokens` and pack its output: [B, S, d_model]."""
  hidden_YxLxD = encoder(jnp.asarray(tokens.input_ids), jnp.asarray(tokens.attention_mask))
  return pack_glyph_embeds(hidden_YxLxD, tokens.gather_index, tokens.gather_mask)
