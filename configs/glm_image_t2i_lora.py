"""LoRA GRPO on the released GLM-Image, text-to-image at 1024 x 1024: one accelerator's worth of training.

python main.py --config=configs/glm_image_t2i_lora.py --config.model.checkpoint_dir=CONVERTED
  --config.data.prompts_file=prompts.txt --workdir=DIR
`:tiny` shrinks it to the random tiny model and a 64 x 64 target for a local run. `:hps` trains on HPS v2.1 instead
of the JPEG size (the reward DanceGRPO, MixGRPO and TempFlow-GRPO train on; docs/rewards.md), every other value as
below; `:hps,tiny` shrinks it the same way. Both take the converted HPS folder and its tokenizer:
  --config.rewards[0].kwargs.ckpt_dir=HPS --config.rewards[0].kwargs.tokenizer_dir=CLIP_H_TOKENIZER

The base generator stays frozen in bfloat16; rank-64 adapters on every linear layer of its decoder
(attention q/k/v/o, MLP gate_up/down) train with their float32 master copy and AdamW moments. The
KL reference is the same model with the adapters off (no second copy of the base).
Sources of the values, where published recipes give them:
- rank and alpha: alpha = 2 x rank, as Flow-GRPO's LoRA (r=32, lora_alpha=64; github.com/yifan123/flow_grpo,
  scripts/train_sd3.py); rank 64 because the AR decoder is larger than SD3.5-M's DiT.
- learning rate: Flow-GRPO trains its LoRA at 3e-4 (config/base.py), full fine-tuning here uses 1e-6; 1e-4
  is our choice between the two for the 9B decoder (not yet tuned at full size).
- KL: beta 0.01 as Flow-GRPO's PickScore recipe (config/grpo.py, pickscore_sd3: train.beta = 0.01).
- group size 16 (the released-model t2i config; Flow-GRPO samples 24 per prompt) and the token-level clip
  range 0.2 / 0.28 of GRPO (DeepSeekMath) with DAPO's clip-higher: Flow-GRPO's 1e-4 clips a per-step mean
  over latent elements of the decoder, not the AR tokens' ratios.
"""

from ml_collections import config_dict

from configs import glm_image_t2i

VARIANTS = ("tiny", "hps", "hps,tiny")


def get_config(arg=None):
  if arg and arg not in VARIANTS:
    raise ValueError(f"unknown config argument {arg!r}; expected nothing or one of {list(VARIANTS)}")
  parts = set(arg.split(",")) if arg else set()
  c = glm_image_t2i.get_config("tiny" if "tiny" in parts else None)
  c.lora.rank = 64
  c.lora.alpha = 128.0
  c.lora.targets = "ar"
  c.model.param_dtype = "bfloat16"  # the frozen base; adapters keep a float32 master copy
  c.optim.learning_rate = 1e-4
  c.grpo.beta = 0.01
  # Kept from glm_image_t2i / common: group_size 16, epsilon_low 0.2, epsilon_high 0.28 (sources above).
  if "hps" in parts:  # hpsv2.score's scale (cosines around 0.2-0.3), as DanceGRPO trains on it
    c.rewards = (config_dict.ConfigDict({"name": "hps", "weight": 1.0, "kwargs": {
        "ckpt_dir": config_dict.placeholder(str), "tokenizer_dir": config_dict.placeholder(str)}}),)
  if "tiny" in parts:
    c.model.param_dtype = "float32"
    c.lora.rank = 4
    c.lora.alpha = 8.0
    c.optim.learning_rate = 1e-2  # the tiny random model: what makes its reward rise in a few steps
  return c
