"""Key map of the glyph encoder (`text_encoder/`, transformers T5EncoderModel) <-> `glmrl.models.glyph.T5Encoder`.

`shared.weight` and `encoder.embed_tokens.weight` are the same tied tensor in the reference; both
map to `embed.embedding` (a checkpoint may hold either or both). Flax -> HF renders `shared.weight`,
the first rule, which T5EncoderModel ties back to `encoder.embed_tokens`.
"""

from checkpoints_convert.rules import IDENTITY, TRANSPOSE, Rule

_BLOCK = "encoder.block.{i}.layer"

RULES = (
    Rule("shared.weight", "embed.embedding", IDENTITY),
    Rule("encoder.embed_tokens.weight", "embed.embedding", IDENTITY),
    Rule("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
         "relative_attention_bias", IDENTITY),
    Rule(_BLOCK + ".0.layer_norm.weight", "layers.{i}.attn_norm.scale", IDENTITY),
    Rule(_BLOCK + ".0.SelfAttention.q.weight", "layers.{i}.attn.q.kernel", TRANSPOSE),
    Rule(_BLOCK + ".0.SelfAttention.k.weight", "layers.{i}.attn.k.kernel", TRANSPOSE),
    Rule(_BLOCK + ".0.SelfAttention.v.weight", "layers.{i}.attn.v.kernel", TRANSPOSE),
    Rule(_BLOCK + ".0.SelfAttention.o.weight", "layers.{i}.attn.o.kernel", TRANSPOSE),
    Rule(_BLOCK + ".1.layer_norm.weight", "layers.{i}.ff_norm.scale", IDENTITY),
    Rule(_BLOCK + ".1.DenseReluDense.wi.weight", "layers.{i}.ff.wi.kernel", TRANSPOSE),
    Rule(_BLOCK + ".1.DenseReluDense.wi_0.weight", "layers.{i}.ff.wi_0.kernel", TRANSPOSE),
    Rule(_BLOCK + ".1.DenseReluDense.wi_1.weight", "layers.{i}.ff.wi_1.kernel", TRANSPOSE),
    Rule(_BLOCK + ".1.DenseReluDense.wo.weight", "layers.{i}.ff.wo.kernel", TRANSPOSE),
    Rule("encoder.final_layer_norm.weight", "final_norm.scale", IDENTITY),
)
