"""GLM-Image's decoupled RL on the released model, text-to-image at 1024 x 1024: the AR generator on
low-frequency rewards (aesthetics, semantic alignment), the DiT decoder on high-frequency ones (text accuracy),
from one rollout per step.

python main.py --config=configs/glm_image_t2i_decoupled.py --config.model.checkpoint_dir=CONVERTED
  --config.data.prompts_file=prompts.txt --workdir=DIR
  --config.rewards[0].kwargs.clip_dir=CLIP --config.rewards[0].kwargs.head_dir=HEAD
  --config.rewards[1].kwargs.ckpt_dir=PICKSCORE --config.decoder.rewards[0].kwargs.url=http://OCR_SERVER
`:tiny` shrinks it to the random tiny model, a 64 x 64 target and built-in rewards for a local run.
The decoder's OCR reward is served by the shipped scorer (docs/ocr_scorer.md), started before the run:

  pip install -r requirements-ocr.txt && pip install --no-deps -r requirements-ocr-nodeps.txt
  python -m glmrl.rewards.server --scorer=glmrl.rewards.scorers.ocr:read --port=8001

and passed as --config.decoder.rewards[0].kwargs.url=http://127.0.0.1:8001/score.

The split follows the GLM-Image report (AR: aesthetics and semantic alignment; decoder: detail and text
accuracy). The rollout is prompts x 8 token grids x 4 decoder samples = 32 images per prompt: an AR group
compares 8 grids (each scored by the mean of its 4 decoder samples, which share their noise across the
grids), a decoder group compares the 4 samples of one grid (docs/decoder_rl.md).
Decoder values follow Flow-GRPO's SD3.5 recipe (github.com/yifan123/flow_grpo, config/grpo.py and
config/base.py): noise level 0.7, 10 training steps, clip range 1e-4, advantages clipped at 5, LoRA r=32
alpha=64 at 3e-4; the SDE window of 2 steps at a random start is Flow-GRPO-Fast's (our choice of size).
The DiT is anchored to the base (its adapters off) by a KL of weight decoder.beta = 0.04, Flow-GRPO's OCR recipe's
(config/grpo.py `general_ocr_sd3`, train.beta): OCR reward alone is hacked by drawing text over the image, and
peers report OCR RL that destroys image content unless anchored (UniRL PR #407); the KL costs one more DiT forward
per trained step (the adapters-off reference), --config.decoder.beta=0 drops it.
Checked at full size with --mode=compile (docs/reference/fits.md); not yet trained at full size.
"""

from ml_collections import config_dict

from configs import glm_image_t2i_lora



def _required():
  # A fresh placeholder per field: one shared FieldReference would link every field it is assigned to.
  return config_dict.placeholder(str)


def get_config(arg=None):
  if arg not in (None, "", "tiny"):
    raise ValueError(f"unknown config argument {arg!r}; expected nothing or 'tiny'")
  c = glm_image_t2i_lora.get_config(arg)
  c.train.policies = "ar+decoder"
  c.data.prompts_per_step = 4
  c.grpo.group_size = 8
  c.decoder.group_size = 4
  c.decoder.train_steps = 10
  c.decoder.window_size = 2
  c.decoder.window_start = -1
  c.decoder.noise_level = 0.7
  c.decoder.clip_range = 1e-4
  c.decoder.adv_clip_max = 5.0
  c.decoder.beta = 0.04  # the KL anchor to the base (see the docstring)
  c.decoder.lora.rank = 32
  c.decoder.lora.alpha = 64.0
  c.decoder.optim.learning_rate = 3e-4
  c.decoder.micro_batch_size = 4
  c.rewards = (
      config_dict.ConfigDict({"name": "laion_aesthetic", "weight": 1.0,
                              "kwargs": {"clip_dir": _required(), "head_dir": _required()}}),
      config_dict.ConfigDict({"name": "pickscore", "weight": 1.0, "kwargs": {"ckpt_dir": _required()}}),
  )
  # OCR text accuracy read by the shipped scorer's server (the command in this file's docstring).
  c.decoder.rewards = (
      config_dict.ConfigDict({"name": "text_accuracy", "weight": 1.0,
                              "kwargs": {"url": _required(), "no_text_score": 0.0}}),
  )
  if arg == "tiny":
    c.data.prompts_per_step = 2
    c.grpo.group_size = 4
    c.decoder.group_size = 2
    c.decoder.train_steps = 4
    c.decoder.micro_batch_size = 0
    c.decoder.lora.rank = 4
    c.decoder.lora.alpha = 8.0
    c.decoder.optim.learning_rate = 1e-2
    c.rewards = (config_dict.ConfigDict({"name": "brightness", "weight": 1.0}),)
    c.decoder.rewards = (config_dict.ConfigDict({"name": "saturation", "weight": 1.0}),)
  return c
