"""Key map of ImageReward's state_dict (THUDM/ImageReward `ImageReward.pt`: BLIP's own module names) <->
`glmrl.models.blip.ImageRewardModel`.

The keys are those after `checkpoints_convert.image_reward.prepare_state`, which splits each ViT block's fused
`attn.qkv` into `attn.q`, `attn.k`, `attn.v` and drops the leading unit axes of `cls_token` and `pos_embed`.
"""

from checkpoints_convert.maps.clip import AESTHETIC_TORCH_LINEARS
from checkpoints_convert.rules import CONV2D, IDENTITY, TRANSPOSE, Rule

VISION, TEXT = "blip.visual_encoder", "blip.text_encoder"
# BLIP_Pretrain's contrastive projections and the text encoder's position-id buffer: not used by the score.
UNUSED = ("blip.vision_proj.weight", "blip.vision_proj.bias", "blip.text_proj.weight", "blip.text_proj.bias",
          f"{TEXT}.embeddings.position_ids")


def _linear(src: str, dst: str) -> tuple[Rule, ...]:
  return (Rule(f"{src}.weight", f"{dst}.kernel", TRANSPOSE), Rule(f"{src}.bias", f"{dst}.bias", IDENTITY))


def _norm(src: str, dst: str) -> tuple[Rule, ...]:
  return (Rule(f"{src}.weight", f"{dst}.scale", IDENTITY), Rule(f"{src}.bias", f"{dst}.bias", IDENTITY))


def _vision_block() -> tuple[Rule, ...]:
  src, dst = f"{VISION}.blocks.{{i}}", "vision.layers.{i}"
  return (*_norm(f"{src}.norm1", f"{dst}.norm1"), *_norm(f"{src}.norm2", f"{dst}.norm2"),
          *(r for name in "qkv" for r in _linear(f"{src}.attn.{name}", f"{dst}.attn.{name}")),
          *_linear(f"{src}.attn.proj", f"{dst}.attn.o"),
          *_linear(f"{src}.mlp.fc1", f"{dst}.mlp.fc1"), *_linear(f"{src}.mlp.fc2", f"{dst}.mlp.fc2"))


def _attention(src: str, dst: str) -> tuple[Rule, ...]:
  return (*(r for hf, fx in (("query", "q"), ("key", "k"), ("value", "v"))
            for r in _linear(f"{src}.self.{hf}", f"{dst}.{fx}")),
          *_linear(f"{src}.output.dense", f"{dst}.o"), *_norm(f"{src}.output.LayerNorm", f"{dst}.norm"))


def _text_layer() -> tuple[Rule, ...]:
  src, dst = f"{TEXT}.encoder.layer.{{i}}", "text.layers.{i}"
  return (*_attention(f"{src}.attention", f"{dst}.self_attn"),
          *_attention(f"{src}.crossattention", f"{dst}.cross_attn"),
          *_linear(f"{src}.intermediate.dense", f"{dst}.fc1"), *_linear(f"{src}.output.dense", f"{dst}.fc2"),
          *_norm(f"{src}.output.LayerNorm", f"{dst}.ffn_norm"))


RULES = (
    Rule(f"{VISION}.cls_token", "vision.class_embedding", IDENTITY),
    Rule(f"{VISION}.pos_embed", "vision.position_embedding", IDENTITY),
    Rule(f"{VISION}.patch_embed.proj.weight", "vision.patch_embedding.kernel", CONV2D),
    Rule(f"{VISION}.patch_embed.proj.bias", "vision.patch_embedding.bias", IDENTITY),
    *_vision_block(),
    *_norm(f"{VISION}.norm", "vision.final_norm"),
    Rule(f"{TEXT}.embeddings.word_embeddings.weight", "text.word_embeddings.embedding", IDENTITY),
    Rule(f"{TEXT}.embeddings.position_embeddings.weight", "text.position_embeddings", IDENTITY),
    *_norm(f"{TEXT}.embeddings.LayerNorm", "text.embed_norm"),
    *_text_layer(),
    # ImageReward's MLP: an nn.Sequential whose Dropouts occupy indices 1, 3, 5, as the aesthetic predictor's.
    *(r for i, torch_index in enumerate(AESTHETIC_TORCH_LINEARS)
      for r in _linear(f"mlp.layers.{torch_index}", f"head.layers.{i}")),
)
