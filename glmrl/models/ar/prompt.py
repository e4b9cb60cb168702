"""GLM-Image prompts: chat template, generation grids, tokenization, left-padded batches.

Layout of one prompt (what transformers' `GlmImageProcessor` builds):

  text-to-image:  chat(prompt) <sop>H W<eop> <sop>h w<eop> <bos>
  image-to-image: chat(images, prompt) <sop>H W<eop> <bos>

where H x W is the target token grid (pixels / 32), h x w the small preview grid
the model draws first in text-to-image, and <bos> the image-start token the
generated tokens follow. Each condition image appears in the chat text as
image-start, one `<|image|>` placeholder per vision patch, image-end. No torch:
the tokenizer is the checkpoint's fast tokenizer loaded by transformers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Sequence

import numpy as np

from glmrl.errors import UserError
from glmrl.models.ar import image_processing
from glmrl.models.ar.image_processing import ImageProcessorConfig

FACTOR = 32  # target pixels per token side
PREVIEW_SIDE = 16  # a square target gets a 16 x 16 preview


def check_size(height, width) -> None:
  for name, value in (("height", height), ("width", width)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0 or value % FACTOR:
      raise ValueError(f"{name}={value!r} must be a positive multiple of {FACTOR}")


def grid_sizes(height: int, width: int) -> tuple[int, int, int, int]:
  """(token_h, token_w, preview_h, preview_w) for a target image of height x width pixels."""
  check_size(height, width)
  token_h, token_w = height // FACTOR, width // FACTOR
  ratio = token_h / token_w
  return token_h, token_w, int(math.sqrt(ratio) * PREVIEW_SIDE), int(math.sqrt(1 / ratio) * PREVIEW_SIDE)


@dataclasses.dataclass(frozen=True)
class GenerationLayout:
  """The grids the model generates, in generation order, then one end token (hashable, static)."""
  grids: tuple[tuple[int, int], ...]
  target: int  # index of the target grid in `grids`

  @classmethod
  def for_size(cls, height: int, width: int, text_to_image: bool) -> "GenerationLayout":
    token_h, token_w, prev_h, prev_w = grid_sizes(height, width)
    if text_to_image:
      return cls(grids=((prev_h, prev_w), (token_h, token_w)), target=1)
    return cls(grids=((token_h, token_w),), target=0)

  @property
  def text_to_image(self) -> bool:
    return len(self.grids) == 2

  @property
  def num_new_tokens(self) -> int:
    return sum(h * w for h, w in self.grids) + 1

  def grid_slice(self, index: int) -> slice:
    start = sum(h * w for h, w in self.grids[:index])
    h, w = self.grids[index]
    return slice(start, start + h * w)

  @property
  def target_hw(self) -> tuple[int, int]:
    return self.grids[self.target]

  @property
  def preview_hw(self) -> tuple[int, int] | None:
    return self.grids[0] if self.text_to_image else None

  def grid_thw(self) -> np.ndarray:
    """The processor's rows for the generated grids: target first, then the preview."""
    order = [self.target] + [i for i in range(len(self.grids)) if i != self.target]
    return np.asarray([(1, *self.grids[i]) for i in order], np.int64)


@dataclasses.dataclass(frozen=True)
class TokenizedPrompts:
  """A left-padded batch of prompts, host-side numpy.

  image_grid_thw / images_per_sample follow the processor: per sample its condition
  grids, then the target grid (and the preview grid for text-to-image).
  pixel_values / source_grid_thw hold the condition images of all samples in order
  (None for text-to-image); their VQ ids replace the `<|image|>` placeholders
  (`glmrl.models.ar.model.merge_image_tokens`).
  """
  input_ids: np.ndarray  # [B, L] int32
  valid: np.ndarray  # [B, L] bool, False on left padding
  image_grid_thw: np.ndarray  # [sum(images_per_sample), 3] int64
  images_per_sample: np.ndarray  # [B] int64
  layout: GenerationLayout
  pixel_values: np.ndarray | None = None  # [num_patches, C*T*P*P] float32
  source_grid_thw: np.ndarray | None = None  # [B * num_source, 3] int64
  texts: tuple[str, ...] = ()


def _read_json(path: pathlib.Path) -> dict:
  return json.loads(path.read_text())


class PromptProcessor:
  """Builds GLM-Image prompt batches with the checkpoint's tokenizer and chat template."""

  def __init__(self, tokenizer, chat_template: str, image_cfg: ImageProcessorConfig):
    for name in ("image_token", "grid_bos_token", "grid_eos_token"):
      if not getattr(tokenizer, name, None):
        raise ValueError(f"tokenizer has no {name}; load the GLM-Image processor tokenizer")
    if tokenizer.bos_token is None or tokenizer.pad_token_id is None:
      raise ValueError("tokenizer needs a bos_token (image start) and a pad token")
    self.tokenizer = tokenizer
    self.chat_template = chat_template
    self.image_cfg = image_cfg
    self.image_token = tokenizer.image_token
    self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
    self.grid_bos, self.grid_eos, self.bos = tokenizer.grid_bos_token, tokenizer.grid_eos_token, tokenizer.bos_token
    self.pad_token_id = int(tokenizer.pad_token_id)

  @classmethod
  def from_pretrained(cls, path: str | os.PathLike) -> "PromptProcessor":
    """From a checkpoint folder (uses its processor/) or the processor folder itself."""
    from transformers import AutoTokenizer

    path = pathlib.Path(path)
    if (path / "processor").is_dir():
      path = path / "processor"
    if not (path / "tokenizer_config.json").is_file():
      raise UserError(f"{path} holds no tokenizer_config.json (expected a GLM-Image processor folder)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    processor_cfg = _read_json(path / "processor_config.json") if (path / "processor_config.json").is_file() else {}
    if (path / "chat_template.jinja").is_file():
      template = (path / "chat_template.jinja").read_text()
    elif (path / "chat_template.json").is_file():
      template = _read_json(path / "chat_template.json")["chat_template"]
    else:
      template = processor_cfg.get("chat_template") or getattr(tokenizer, "chat_template", None)
    if not template:
      raise UserError(f"no chat template in {path}")
    if (path / "preprocessor_config.json").is_file():
      image_cfg = ImageProcessorConfig.from_hf(_read_json(path / "preprocessor_config.json"))
    elif "image_processor" in processor_cfg:
      image_cfg = ImageProcessorConfig.from_hf(processor_cfg["image_processor"])
    else:
      raise UserError(f"no image processor config (preprocessor_config.json) in {path}")
    return cls(tokenizer, template, image_cfg)

  def render(self, prompt: str, images: Sequence = ()) -> str:
    """The chat-templated user turn: condition images first, then the text (as the pipeline builds it)."""
    content = [{"type": "image", "image": im} for im in images] + [{"type": "text", "text": prompt}]
    return self.tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                              chat_template=self.chat_template, tokenize=False)

  def suffix(self, layout: GenerationLayout) -> str:
    """Target grid, preview grid (text-to-image) and the image-start token that opens generation."""
    rows = layout.grid_thw()
    return "".join(f"{self.grid_bos}{h} {w}{self.grid_eos}" for _, h, w in rows) + self.bos

  def __call__(self, prompts: Sequence[str], height: int, width: int, images: Sequence[Sequence] | None = None,
               pad_to_multiple_of: int | None = None) -> TokenizedPrompts:
    """Tokenizes a batch; `images[i]` are the condition images of prompt i (image-to-image).

    All samples share the target size and the number of condition images. Prompts are
    left-padded to the longest (rounded up to `pad_to_multiple_of`, to reuse compilations).
    """
    if isinstance(prompts, str) or len(prompts) == 0 or not all(isinstance(p, str) for p in prompts):
      raise ValueError(f"prompts must be a non-empty list of strings, got {prompts!r:.200}")
    if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of <= 0):
      raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be a positive int")
    text_to_image = images is None
    layout = GenerationLayout.for_size(height, width, text_to_image)
    if not text_to_image:
      if len(images) != len(prompts):
        raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
      counts = sorted({len(ims) for ims in images})
      if counts == [0] or len(counts) != 1:
        raise ValueError(f"every prompt needs the same number (>= 1) of condition images, got counts {counts}")
    images = [[] for _ in prompts] if text_to_image else [list(ims) for ims in images]

    pixel_values = source_grid_thw = None
    if not text_to_image:
      pixel_values, source_grid_thw = image_processing.preprocess([im for ims in images for im in ims],
                                                                  self.image_cfg)
    rendered = [self.render(p, ims) for p, ims in zip(prompts, images)]
    texts, grids, k = [], [], 0
    for text, ims in zip(rendered, images):
      parts = text.split(self.image_token)
      if len(parts) - 1 != len(ims):
        raise ValueError(f"the chat template produced {len(parts) - 1} {self.image_token} for {len(ims)} images")
      expanded = parts[0]
      for part in parts[1:]:
        expanded += self.image_token * image_processing.num_image_tokens(source_grid_thw[k], self.image_cfg) + part
        grids.append(source_grid_thw[k])
        k += 1
      texts.append(expanded + self.suffix(layout))
      grids.extend(layout.grid_thw())

    # As the reference processor: a template that already starts with <bos> gets no extra special tokens.
    add_special = not rendered[0].startswith(self.bos)
    ids = [self.tokenizer(t, add_special_tokens=add_special)["input_ids"] for t in texts]
    length = max(len(x) for x in ids)
    if pad_to_multiple_of:
      length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = np.full((len(ids), length), self.pad_token_id, np.int32)
    valid = np.zeros((len(ids), length), bool)
    for i, x in enumerate(ids):
      input_ids[i, length - len(x):] = x
      valid[i, length - len(x):] = True
    per_sample = len(images[0]) + len(layout.grids)
    return TokenizedPrompts(input_ids=input_ids, valid=valid,
                            image_grid_thw=np.asarray(grids, np.int64).reshape(-1, 3),
                            images_per_sample=np.full(len(ids), per_sample, np.int64), layout=layout,
                            pixel_values=pixel_values, source_grid_thw=source_grid_thw, texts=tuple(texts))
