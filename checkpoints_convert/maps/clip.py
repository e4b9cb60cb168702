"""Key map of a transformers `CLIPModel` state_dict <-> `glmrl.models.clip.ClipModel`.

Both released layouts (openai/clip-vit-large-patch14, the OpenCLIP ViT-H/14 of PickScore) share these
keys. Checkpoints saved before transformers 4.31 also hold `{text,vision}_model.embeddings.position_ids`
(arange buffers, not parameters); `checkpoints_convert.clip` drops them before conversion.
"""

from checkpoints_convert.rules import CONV2D, IDENTITY, TRANSPOSE, Rule


def _layer_rules(hf_tower: str, flax_tower: str) -> tuple[Rule, ...]:
  hf, fx = f"{hf_tower}.encoder.layers.{{i}}", f"{flax_tower}.layers.{{i}}"
  rules = []
  for hf_name, fx_name in (("layer_norm1", "norm1"), ("layer_norm2", "norm2")):
    rules.append(Rule(f"{hf}.{hf_name}.weight", f"{fx}.{fx_name}.scale", IDENTITY))
    rules.append(Rule(f"{hf}.{hf_name}.bias", f"{fx}.{fx_name}.bias", IDENTITY))
  for hf_name, fx_name in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
    rules.append(Rule(f"{hf}.self_attn.{hf_name}.weight", f"{fx}.attn.{fx_name}.kernel", TRANSPOSE))
    rules.append(Rule(f"{hf}.self_attn.{hf_name}.bias", f"{fx}.attn.{fx_name}.bias", IDENTITY))
  for name in ("fc1", "fc2"):
    rules.append(Rule(f"{hf}.mlp.{name}.weight", f"{fx}.mlp.{name}.kernel", TRANSPOSE))
    rules.append(Rule(f"{hf}.mlp.{name}.bias", f"{fx}.mlp.{name}.bias", IDENTITY))
  return tuple(rules)


def _norm_rules(hf: str, fx: str) -> tuple[Rule, ...]:
  return (Rule(f"{hf}.weight", f"{fx}.scale", IDENTITY), Rule(f"{hf}.bias", f"{fx}.bias", IDENTITY))


RULES = (
    Rule("text_model.embeddings.token_embedding.weight", "text.token_embedding.embedding", IDENTITY),
    Rule("text_model.embeddings.position_embedding.weight", "text.position_embedding", IDENTITY),
    *_layer_rules("text_model", "text"),
    *_norm_rules("text_model.final_layer_norm", "text.final_norm"),
    Rule("vision_model.embeddings.class_embedding", "vision.class_embedding", IDENTITY),
    Rule("vision_model.embeddings.patch_embedding.weight", "vision.patch_embedding.kernel", CONV2D),
    Rule("vision_model.embeddings.position_embedding.weight", "vision.position_embedding", IDENTITY),
    *_norm_rules("vision_model.pre_layrnorm", "vision.pre_norm"),
    *_layer_rules("vision_model", "vision"),
    *_norm_rules("vision_model.post_layernorm", "vision.post_norm"),
    Rule("text_projection.weight", "text_projection.kernel", TRANSPOSE),
    Rule("visual_projection.weight", "visual_projection.kernel", TRANSPOSE),
    Rule("logit_scale", "logit_scale", IDENTITY),
)

# The LAION improved aesthetic predictor's MLP (`sac+logos+ava1-l14-linearMSE.pth`): an
# nn.Sequential whose Dropouts occupy indices 1, 3, 5, so its Linears are layers 0, 2, 4, 6, 7.
AESTHETIC_TORCH_LINEARS = (0, 2, 4, 6, 7)
AESTHETIC_RULES = tuple(
    rule for i, torch_index in enumerate(AESTHETIC_TORCH_LINEARS) for rule in (
        Rule(f"layers.{torch_index}.weight", f"layers.{i}.kernel", TRANSPOSE),
        Rule(f"layers.{torch_index}.bias", f"layers.{i}.bias", IDENTITY)))
