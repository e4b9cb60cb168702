"""A loaded CLIP with what reward scoring needs around it.

Text: prompts are tokenized on the host and embedded by a jitted text tower once per distinct
prompt (LRU cache), so a training step only embeds prompts it has not seen. Images: uint8 batches
are preprocessed and embedded on device (`image_embeds` is traceable, no host round trip).
"""

from __future__ import annotations

import collections
import functools
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.models.clip.model import ClipModel, l2_normalize
from glmrl.models.clip.preprocess import ImageProcessing, preprocess
from glmrl.models.clip.tokenizer import PromptTokenizer


def _bucket(n: int) -> int:
  """Next power of two: the text tower compiles for a few batch sizes only."""
  return 1 << (n - 1).bit_length()


class ClipEmbedder:
  """Unit-norm CLIP embeddings of prompts (host, cached) and of uint8 images (device, traceable)."""

  def __init__(self, model: ClipModel, processing: ImageProcessing,
               tokenizer: PromptTokenizer | Callable[[], PromptTokenizer] | None = None, cache_size: int = 16384):
    """`tokenizer`: a PromptTokenizer, a zero-argument loader called on first use, or None (images only)."""
    v = model.cfg.vision
    out_hw = processing.output_hw(v.image_size, v.image_size)
    fixed = processing.do_center_crop or processing.pad_size is not None  # one output size for any input
    if not fixed or out_hw != (v.image_size, v.image_size):
      raise ValueError(f"preprocessing gives {out_hw[0]}x{out_hw[1]} images (center crop "
                       f"{processing.do_center_crop}, pad {processing.pad_size}), the vision tower takes "
                       f"{v.image_size}x{v.image_size}")
    self.model = model
    self.processing = processing
    self._tokenizer = tokenizer
    self.cache_size = cache_size
    self._cache: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
    graphdef, state = nnx.split(model)
    self._state = state

    @jax.jit
    def embed_text(state, ids_BxL, mask_BxL):
      return l2_normalize(nnx.merge(graphdef, state).text_features(ids_BxL, mask_BxL))

    self._embed_text = embed_text

  @property
  def tokenizer(self) -> PromptTokenizer:
    if self._tokenizer is None:
      raise ValueError("this ClipEmbedder has no tokenizer; build it with one to embed prompts")
    if not isinstance(self._tokenizer, PromptTokenizer):
      self._tokenizer = self._tokenizer()
    limit = self.model.cfg.text.max_position_embeddings
    if self._tokenizer.max_length > limit:
      raise ValueError(f"tokenizer max_length={self._tokenizer.max_length} exceeds the text tower's "
                       f"max_position_embeddings={limit}")
    return self._tokenizer

  @property
  def dim(self) -> int:
    return self.model.cfg.projection_dim

  def logit_scale(self) -> jax.Array:
    """exp(learned logit_scale), float32 scalar."""
    return jnp.exp(self.model.logit_scale[...].astype(jnp.float32))

  def text_embeds(self, prompts: Sequence[str]) -> np.ndarray:
    """float32 [B, P] unit-norm text embeddings (host numpy)."""
    if isinstance(prompts, str):
      raise ValueError(f"prompts must be a list of strings, got the single string {prompts!r}")
    if not prompts:
      raise ValueError("prompts is empty")
    missing = list(dict.fromkeys(p for p in prompts if p not in self._cache))
    if missing:
      ids, mask = self.tokenizer(missing)
      n = len(missing)
      pad = _bucket(n) - n
      ids = np.concatenate([ids, np.repeat(ids[:1], pad, axis=0)])
      mask = np.concatenate([mask, np.repeat(mask[:1], pad, axis=0)])
      # Concrete even when called while another function is traced (a reward given its prompts under jit).
      with jax.ensure_compile_time_eval():
        embeds = np.asarray(self._embed_text(self._state, jnp.asarray(ids), jnp.asarray(mask)))[:n]
      for prompt, e in zip(missing, embeds):
        self._cache[prompt] = e
    out = []
    for p in prompts:
      self._cache.move_to_end(p)
      out.append(self._cache[p])
    while len(self._cache) > self.cache_size:
      self._cache.popitem(last=False)
    return np.stack(out).astype(np.float32)

  def image_embeds(self, images_Bxhxwx3) -> jax.Array:
    """float32 [B, P] unit-norm image embeddings of uint8 images; traceable under jit."""
    return l2_normalize(self.model.image_features(preprocess(images_Bxhxwx3, self.processing)))


def load_embedder(ckpt_dir: str, *, tokenizer_dir: str | None = None, sharding=None,
                  processing: ImageProcessing | None = None, text_clean: Callable[[str], str] | None = None,
                  **config_overrides) -> ClipEmbedder:
  """A ClipEmbedder from a converted CLIP folder; the tokenizer (files in `tokenizer_dir`, default
  `ckpt_dir`) is loaded on the first `text_embeds` call, so image-only users never need it.
  `processing`: the reward's own preprocessing (HPS v2.1's), else the folder's; `text_clean`: its own text
  cleaning before tokenizing (`PromptTokenizer`'s `clean`). `sharding` and
  `config_overrides` go to `load_clip`."""
  from glmrl.models.clip.checkpoint import load_clip, load_image_processing

  if not isinstance(ckpt_dir, str) or not os.path.isdir(ckpt_dir):
    raise ValueError(f"CLIP ckpt_dir={ckpt_dir!r} is not a directory (convert a CLIPModel folder with "
                     "`python -m checkpoints_convert.clip`)")
  model = load_clip(ckpt_dir, sharding, **config_overrides)
  max_length = model.cfg.text.max_position_embeddings
  return ClipEmbedder(model, processing or load_image_processing(ckpt_dir),
                      lambda: PromptTokenizer.from_pretrained(tokenizer_dir or ckpt_dir, max_length, clean=text_clean))


@functools.lru_cache(maxsize=4)
def _cached(ckpt_dir: str, tokenizer_dir: str | None, sharding, processing, text_clean) -> ClipEmbedder:
  return load_embedder(ckpt_dir, tokenizer_dir=tokenizer_dir, sharding=sharding, processing=processing,
                       text_clean=text_clean)


def cached_embedder(ckpt_dir: str, *, tokenizer_dir: str | None = None, sharding=None,
                    processing: ImageProcessing | None = None,
                    text_clean: Callable[[str], str] | None = None) -> ClipEmbedder:
  """`load_embedder`, once per (folder, sharding): rewards that share a CLIP (the CLIP score and the
  aesthetic predictor both read ViT-L/14) share one copy of its weights and its prompt cache, and
  weights placed for one mesh are never handed to code running on another."""
  if not isinstance(ckpt_dir, str) or not ckpt_dir:
    raise ValueError(f"CLIP ckpt_dir={ckpt_dir!r} must name a converted CLIP folder")
  return _cached(os.path.abspath(ckpt_dir), tokenizer_dir and os.path.abspath(tokenizer_dir), sharding, processing,
                 text_clean)
