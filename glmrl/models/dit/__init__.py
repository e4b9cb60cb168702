"""GLM-Image DiT decoder: config, model and the functional source-image KV cache."""

from glmrl.models.dit.config import DiTConfig
from glmrl.models.dit.kv_cache import CACHE_MODES, DiTKVCache, append_images, stack_slots
from glmrl.models.dit.model import GlmImageDiT

__all__ = ["CACHE_MODES", "DiTConfig", "DiTKVCache", "GlmImageDiT", "append_images", "stack_slots"]
