"""Key map of `transformer/` (diffusers GlmImageTransformer2DModel) <-> `GlmImageDiT`."""

from checkpoints_convert.rules import IDENTITY, TRANSPOSE, Rule


def _linear(hf: str, flax: str) -> tuple[Rule, Rule]:
  return (Rule(f"{hf}.weight", f"{flax}.kernel", TRANSPOSE),
          Rule(f"{hf}.bias", f"{flax}.bias", IDENTITY))


def _feed_forward(hf: str, flax: str) -> tuple[Rule, ...]:
  # diffusers FeedForward: net.0 is the activation module holding the input projection,
  # net.1 a dropout, net.2 the output projection.
  return _linear(f"{hf}.net.0.proj", f"{flax}.fc1") + _linear(f"{hf}.net.2", f"{flax}.fc2")


_BLOCK_HF = "transformer_blocks.{i}"
_BLOCK = "blocks.{i}"

RULES = (
    *_linear("image_projector.proj", "image_proj"),
    *_feed_forward("glyph_projector", "glyph_proj"),
    Rule("prior_token_embedding.weight", "prior_embed.embedding", IDENTITY),
    *_feed_forward("prior_projector", "prior_proj"),
    *_linear("time_condition_embed.timestep_embedder.linear_1", "time_embed.time_fc1"),
    *_linear("time_condition_embed.timestep_embedder.linear_2", "time_embed.time_fc2"),
    *_linear("time_condition_embed.condition_embedder.linear_1", "time_embed.cond_fc1"),
    *_linear("time_condition_embed.condition_embedder.linear_2", "time_embed.cond_fc2"),
    *_linear(f"{_BLOCK_HF}.norm1.linear", f"{_BLOCK}.adaln"),
    *_linear(f"{_BLOCK_HF}.attn1.to_q", f"{_BLOCK}.attn.q"),
    *_linear(f"{_BLOCK_HF}.attn1.to_k", f"{_BLOCK}.attn.k"),
    *_linear(f"{_BLOCK_HF}.attn1.to_v", f"{_BLOCK}.attn.v"),
    *_linear(f"{_BLOCK_HF}.attn1.to_out.0", f"{_BLOCK}.attn.out"),
    *_feed_forward(f"{_BLOCK_HF}.ff", f"{_BLOCK}.mlp"),
    *_linear("norm_out.linear", "norm_out"),
    *_linear("proj_out", "proj_out"),
)
