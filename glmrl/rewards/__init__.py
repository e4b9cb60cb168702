"""Reward functions for GRPO: a registry, built-in rewards and their weighted composition.

Importing this package registers the built-ins: `brightness`, `colorfulness`,
`saturation`, `target_neg_mse`, `target_psnr` (pure JAX) and
`jpeg_compressibility` (host-side), and the model-backed `clip_score`, `pickscore`, `hps`,
`image_reward` and `laion_aesthetic` (pure JAX; built by `RewardComposer` from converted checkpoints).
Also model-backed: `lpips` (pure JAX, -LPIPS to metadata['target_image']), and the host-side
`remote` (scores from a reward server), `text_accuracy` (OCR server, Flow-GRPO's reward) and the OCR metrics
`ocr_word_accuracy` and `ocr_ned` against metadata['text'] (`ocr_metrics.py`), and `geneval` (GenEval's rules over
a remote object detector's boxes, labels and colours), and `vlm_judge` (a VLM asked over the OpenAI
chat-completions protocol).
"""

from glmrl.rewards import image_stats, jpeg, target  # noqa: F401  (registers the built-ins)
from glmrl.rewards import aesthetic, clip_score, hps, pickscore  # noqa: F401  (registers the CLIP rewards)
from glmrl.rewards import image_reward  # noqa: F401  (ImageReward's BLIP)
from glmrl.rewards import lpips, ocr_metrics, remote, text_accuracy  # noqa: F401  (LPIPS, remote, OCR rewards)
from glmrl.rewards import geneval  # noqa: F401  (GenEval's rules over a remote detector)
from glmrl.rewards import vlm_judge  # noqa: F401  (a VLM judge over OpenAI chat completions)
from glmrl.rewards.compose import RewardComposer, group_normalize
from glmrl.rewards.registry import Reward, get, names, register, unregister
from glmrl.rewards.registry import ModelReward, register_factory

__all__ = ["Reward", "RewardComposer", "get", "group_normalize", "names", "register", "unregister"]
__all__ += ["ModelReward", "register_factory"]
