"""A word-level GLM tokenizer for randomly initialised models (the demo and tests).

The released tokenizer cannot be downloaded here; a random model only needs a tokenizer that
carries GLM-Image's special tokens at the model's ids and maps each word of its prompts to its
own id. Real checkpoints use `PromptProcessor.from_pretrained(<checkpoint>/processor)`.
"""

from __future__ import annotations

import re
from typing import Iterable

from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.image_processing import ImageProcessorConfig
from glmrl.models.ar.prompt import PromptProcessor

# The released processor/ tokenizer's special tokens (its tokenizer_config.json).
SPECIAL_TOKENS = {
    "bos_token": "<|dit_token_16384|>",
    "eos_token": "<|dit_token_16385|>",
    "pad_token": "<|dit_token_16385|>",
    "grid_bos_token": "<sop>",
    "grid_eos_token": "<eop>",
    "image_token": "<|image|>",
    "padding_side": "left",
    "model_max_length": 65536,
    "extra_special_tokens": ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
                             "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
                             "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|image|>",
                             "<|video|>"],
}

# The user turn's content, each condition image wrapped in the image start/end markers
# (the layout `get_rope_index` expects).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.content is string -%}{{ message.content }}"
    "{%- else -%}{%- for item in message.content -%}"
    "{%- if item.type == 'image' -%}{{ bos_token }}<|image|>{{ eos_token }}"
    "{%- elif item.type == 'text' -%}{{ item.text }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}{%- endfor -%}")

MAX_GRID_SIDE = 32  # grid sides up to 32 tokens (1024 px) are single words


def words_of(texts: Iterable[str]) -> list[str]:
  """The distinct words and punctuation marks of `texts`, as the whitespace pre-tokenizer splits them."""
  seen = {}
  for text in texts:
    for word in re.findall(r"\w+|[^\w\s]", text):
      seen.setdefault(word, None)
  return list(seen)


def vocabulary(cfg: ARConfig, words: Iterable[str]) -> dict[str, int]:
  """Token -> id: image tokens at their lm_head ids, special tokens and words in the text range."""
  t, sp = cfg.text, SPECIAL_TOKENS
  vocab = {f"<|dit_token_{i}|>": i for i in range(t.vision_vocab_size)}
  # The released marker strings name the released ids; here they sit at this model's ids.
  for name, idx in ((sp["bos_token"], cfg.image_start_token_id), (sp["eos_token"], cfg.image_end_token_id)):
    vocab.pop(f"<|dit_token_{idx}|>", None)
    vocab[name] = idx
  fixed = {sp["image_token"]: cfg.image_token_id, "<|endoftext|>": t.pad_token_id}
  rest = [s for s in sp["extra_special_tokens"] if s not in fixed] + ["[UNK]"]
  rest += [str(n) for n in range(MAX_GRID_SIDE + 1)]
  rest += [w for w in dict.fromkeys(words) if w not in vocab and w not in fixed and w not in rest]
  free = [i for i in range(t.vision_vocab_size, t.vocab_size) if i not in fixed.values()]
  if len(rest) > len(free):
    raise ValueError(f"the model's text vocabulary has {len(free)} free ids but the tokenizer needs {len(rest)} "
                     f"(special tokens, grid sizes and {len(set(words))} words): use fewer distinct words or a "
                     f"larger text vocab_size than {t.vocab_size}")
  vocab.update(fixed)
  vocab.update(zip(rest, free))
  taken = set(vocab.values())
  vocab.update({f"<|reserved_{i}|>": i for i in range(t.vocab_size) if i not in taken})
  return vocab


def word_tokenizer(cfg: ARConfig, words: Iterable[str] = (), prefix_tokens: tuple[str, ...] = ()):
  """A transformers fast tokenizer over `words` plus GLM-Image's special tokens (no download)."""
  from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  sp = SPECIAL_TOKENS
  vocab = vocabulary(cfg, words)
  tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  specials = [s for s in vocab if s.startswith("<|dit_token_")] + [sp["bos_token"], sp["eos_token"]]
  specials += list(sp["extra_special_tokens"]) + ["[UNK]"]
  tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in dict.fromkeys(specials)])
  if prefix_tokens:
    tok.post_processor = processors.TemplateProcessing(
        single=" ".join(prefix_tokens) + " $A", special_tokens=[(s, vocab[s]) for s in prefix_tokens])
  return PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=sp["bos_token"], eos_token=sp["eos_token"], pad_token=sp["pad_token"],
      unk_token="[UNK]", padding_side=sp["padding_side"], model_max_length=sp["model_max_length"],
      extra_special_tokens={"grid_bos_token": sp["grid_bos_token"], "grid_eos_token": sp["grid_eos_token"],
                            "image_token": sp["image_token"]})


def word_processor(cfg: ARConfig, image_cfg: ImageProcessorConfig, texts: Iterable[str]) -> PromptProcessor:
  """A PromptProcessor whose tokenizer knows every word of `texts`."""
  return PromptProcessor(word_tokenizer(cfg, words_of(texts)), CHAT_TEMPLATE, image_cfg)
