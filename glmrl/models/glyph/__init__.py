"""ByT5 glyph encoder (transformers T5EncoderModel) and the pipeline's glyph-text handling.

`T5EncoderConfig.full()` is google/byt5-small's encoder (12 layers, d_model 1472, 6 heads, d_kv 64,
d_ff 3584, gated-GELU, vocab 384); the released text_encoder/config.json was not available, so
load the real one with `T5EncoderConfig.from_hf`.
"""

from glmrl.models.glyph.config import T5EncoderConfig
from glmrl.models.glyph.t5 import T5Encoder
from glmrl.models.glyph.texts import (GlyphTokens, encode_glyph_embeds, extract_glyph_texts,
                                      pack_glyph_embeds, tokenize_glyph_texts)

__all__ = ["GlyphTokens", "T5Encoder", "T5EncoderConfig", "encode_glyph_embeds",
           "extract_glyph_texts", "pack_glyph_embeds", "tokenize_glyph_texts"]
