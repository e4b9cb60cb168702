"""CLIP (transformers `CLIPModel`) in Flax NNX, its on-device image preprocessing and host tokenizer.

Convert a Hugging Face CLIPModel folder with `python -m checkpoints_convert.clip`, then
`load_embedder(folder)` for unit-norm text (host, cached) and image (device, traceable) embeddings.
The LAION aesthetic head is in `glmrl.models.clip.aesthetic`.
"""

from glmrl.models.clip.checkpoint import load_clip, load_image_processing
from glmrl.models.clip.config import ClipConfig, ClipTextConfig, ClipVisionConfig
from glmrl.models.clip.embedder import ClipEmbedder, cached_embedder, load_embedder
from glmrl.models.clip.model import ClipModel, ClipOutput, l2_normalize
from glmrl.models.clip.preprocess import ImageProcessing, preprocess
from glmrl.models.clip.tokenizer import PromptTokenizer

__all__ = ["ClipConfig", "ClipEmbedder", "ClipModel", "ClipOutput", "ClipTextConfig", "ClipVisionConfig",
           "ImageProcessing", "PromptTokenizer", "cached_embedder", "l2_normalize", "load_embedder",
           "load_clip", "load_image_processing", "preprocess"]
