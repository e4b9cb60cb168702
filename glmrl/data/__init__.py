"""Prompt datasets for GRPO: loading, validation and a resumable batch iterator."""

from glmrl.data.iterator import PromptBatch, PromptIterator
from glmrl.data.prompts import PromptRecord, check_image_size, load_image, load_prompts

__all__ = ["PromptBatch", "PromptIterator", "PromptRecord", "check_image_size", "load_image",
           "load_prompts"]
