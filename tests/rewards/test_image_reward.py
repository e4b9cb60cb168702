"""The `image_reward` reward (ImageReward) against transformers' BLIP on a tiny random model saved as ImageReward
releases its checkpoint (BLIP's own key names, the fused ViT qkv, the position-id buffer, the unused contrastive
projections), converted by `python -m checkpoints_convert.image_reward` as users run it.

The `image-reward` package itself cannot run here: its BLIP text encoder (`med.py`) imports helpers transformers 5
removed (`apply_chunking_to_forward` from `modeling_utils`), its ViT needs timm 0.6 and fairscale, and its
constructor downloads bert-base-uncased's tokenizer. transformers' `BlipVisionModel` and `BlipTextModel` are the
same modules ported from BLIP's code (the text encoder under the same names); the head and the normalisation are
`ImageReward.score`'s, written out below.

Tolerances: scores within 1e-5 relative of the reference's on the same pixels (measured 2.6e-7 at most); the
preprocessing against PIL's resize and torchvision's crop within one uint8 step of a normalised pixel, as
tests/models/clip/test_preprocess.py measures PIL's fixed-point filter.
"""

import json
import subprocess
import sys

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from glmrl.models.blip.config import MEAN, STD, ImageRewardConfig
from glmrl.models.blip.model import ImageRewardModel
from glmrl.models.clip.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, preprocess
from glmrl.models.init_rngs import InitRngs
from glmrl.rewards import RewardComposer
from glmrl.rewards import image_reward as image_reward_lib
from tests.cli import ROOT, TIMEOUT_S

# Uneven on purpose: the ViT's 2 heads of 64 (the converter's width / 64), the text encoder's 4 heads of 32 (from
# med_config.json), a text FFN of 96, a head of other widths than the released ones.
VISION = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2, image_size=32,
              patch_size=8, layer_norm_eps=1e-6, hidden_act="gelu")
WORDS = ("a", "red", "cat", "on", "the", "blue", "sofa", "photo", "of", "dog", "sign", "that", "says", "hello")
TEXT = dict(vocab_size=5 + len(WORDS) + 3, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=40, encoder_hidden_size=128, layer_norm_eps=1e-12,
            hidden_act="gelu", is_decoder=True, pad_token_id=0, bos_token_id=2, sep_token_id=3)
HEAD = (24, 12, 8, 4)
PROMPTS = ["a red cat on the blue sofa", "photo of a dog", "a sign that says hello", "cat"]
STEP = 1 / 255 / min(OPENAI_CLIP_STD)


def _blip_vision_key(key: str) -> str:
  """transformers' BlipVisionModel name -> BLIP's `models/vit.py` VisionTransformer name."""
  for hf, blip in (("embeddings.class_embedding", "cls_token"), ("embeddings.position_embedding", "pos_embed"),
                   ("embeddings.patch_embedding", "patch_embed.proj"), ("post_layernorm", "norm"),
                   ("encoder.layers.", "blocks."), ("layer_norm1", "norm1"), ("layer_norm2", "norm2"),
                   ("self_attn.qkv", "attn.qkv"), ("self_attn.projection", "attn.proj")):
    key = key.replace(hf, blip)
  return key


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
  """(folder, the reference modules (vision, text, mlp), the converted folder, the tokenizer folder)."""
  import torch
  from torch import nn
  from transformers import BertTokenizerFast, BlipTextConfig, BlipTextModel, BlipVisionConfig, BlipVisionModel

  out = tmp_path_factory.mktemp("image_reward")
  torch.manual_seed(0)
  vision = BlipVisionModel(BlipVisionConfig(**VISION)).eval()
  text = BlipTextModel(BlipTextConfig(**TEXT), add_pooling_layer=False).eval()
  widths = (TEXT["hidden_size"], *HEAD, 1)
  # ImageReward's MLP: Linears at 0, 2, 4, 6, 7 with Dropouts between, no activations.
  layers = []
  for i in range(len(widths) - 1):
    layers.append(nn.Linear(widths[i], widths[i + 1]))
    if i < len(widths) - 3:
      layers.append(nn.Dropout(0.1))
  mlp = nn.Sequential(*layers).eval()
  with torch.no_grad():  # every parameter random, LayerNorms and biases included; the head's widths kept
    for module in (vision, text, mlp):
      for p in module.parameters():
        p.normal_(0.0, 0.2 if p.ndim == 1 else (p.shape[1] ** -0.5 if module is mlp else 0.1))
  state = {f"blip.visual_encoder.{_blip_vision_key(k)}": v for k, v in vision.state_dict().items()}
  state.update({f"blip.text_encoder.{k}": v for k, v in text.state_dict().items()})
  state["blip.text_encoder.embeddings.position_ids"] = torch.arange(TEXT["max_position_embeddings"])[None]
  state.update({"blip.vision_proj.weight": torch.randn(8, VISION["hidden_size"]), "blip.vision_proj.bias":
                torch.randn(8), "blip.text_proj.weight": torch.randn(8, TEXT["hidden_size"]),
                "blip.text_proj.bias": torch.randn(8)})
  state.update({f"mlp.layers.{k}": v for k, v in mlp.state_dict().items()})
  torch.save(state, out / "ImageReward.pt")
  (out / "med_config.json").write_text(json.dumps({"num_attention_heads": TEXT["num_attention_heads"],
                                                   "layer_norm_eps": TEXT["layer_norm_eps"]}))
  tokenizer = out / "bert"
  tokenizer.mkdir()
  (tokenizer / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
  BertTokenizerFast.from_pretrained(str(tokenizer))  # loads offline
  converted = out / "converted"
  done = subprocess.run([sys.executable, "-m", "checkpoints_convert.image_reward",
                         f"--checkpoint={out / 'ImageReward.pt'}", f"--med_config={out / 'med_config.json'}",
                         f"--out_dir={converted}"], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"-> {converted}" in done.stdout
  return out, (vision, text, mlp), converted, tokenizer


def _reference_scores(modules, pixels_BxHxWxC, ids, mask) -> np.ndarray:
  """`ImageReward.score`'s computation on the reference modules, given preprocessed NHWC pixels."""
  import torch

  vision, text, mlp = modules
  with torch.no_grad():
    image = vision(pixel_values=torch.tensor(np.asarray(pixels_BxHxWxC)).permute(0, 3, 1, 2)).last_hidden_state
    out = text(input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
               attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long), encoder_hidden_states=image,
               encoder_attention_mask=torch.ones(image.shape[:2], dtype=torch.long)).last_hidden_state
    return ((mlp(out[:, 0]) - MEAN) / STD)[:, 0].double().numpy()


def _pil_preprocess(images: np.ndarray, size: int) -> np.ndarray:
  """ImageReward's `_transform(size)` written out: PIL's bicubic resize of the shortest side (torchvision's
  Resize of a PIL image), torchvision's CenterCrop offsets, ToTensor, Normalize."""
  from PIL import Image

  out = []
  for image in images:
    h, w = image.shape[:2]
    short, long = (h, w) if h <= w else (w, h)
    new_long = int(size * long / short)
    nh, nw = (size, new_long) if h <= w else (new_long, size)
    resized = np.asarray(Image.fromarray(image).resize((nw, nh), Image.BICUBIC), np.float32) / 255
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    crop = resized[top:top + size, left:left + size]
    out.append((crop - np.asarray(OPENAI_CLIP_MEAN)) / np.asarray(OPENAI_CLIP_STD))
  return np.stack(out).astype(np.float32)


def test_scores_are_image_rewards_on_the_same_pixels_and_through_the_composer(oracle):
  out, modules, converted, tokenizer = oracle
  composer = RewardComposer([{"name": "image_reward", "weight": 1.0,
                              "kwargs": {"ckpt_dir": str(converted), "tokenizer_dir": str(tokenizer)}}], group_size=2)
  prepared = composer.prepare(PROMPTS)
  ids, mask = prepared[image_reward_lib.PROMPT_IDS], prepared[image_reward_lib.PROMPT_MASK]
  # ImageReward's tokenization: [CLS] words [SEP], padded to 35.
  assert ids.shape == mask.shape == (4, 35) and ids[0, 0] == 2 and mask.sum(1).tolist() == [9, 6, 7, 3]
  rng = np.random.default_rng(0)
  # A downscale, a non-square image whose crop margin (39 - 32 = 7) starts at torchvision's 4 (CLIP's floor: 3),
  # an upscale.
  for h, w in ((64, 64), (40, 49), (24, 24)):
    # Each image its own colour under noise: images the scores can tell apart.
    colour = rng.integers(0, 256, size=(4, 1, 1, 3))
    images = np.clip(colour + rng.integers(-40, 41, size=(4, h, w, 3)), 0, 255).astype(np.uint8)
    got = np.asarray(jax.jit(composer.jax_scores)(images, prepared)["image_reward"])
    pixels = np.asarray(preprocess(jnp.asarray(images), image_reward_lib.preprocessing(VISION["image_size"])))
    want = _reference_scores(modules, pixels, ids, mask)
    assert np.ptp(want) > 1e-2  # the scores differ by ~1000x the tolerance
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"{h}x{w}")
    np.testing.assert_allclose(pixels, _pil_preprocess(images, VISION["image_size"]), rtol=0, atol=STEP * 1.01)


def test_full_size_has_the_released_models_parameters():
  """The released layout against transformers' BLIP modules of the same sizes (built on the meta device) plus
  ImageReward's MLP; BLIP_Pretrain's unused contrastive projections are left out."""
  import torch
  from transformers import BlipTextConfig, BlipTextModel, BlipVisionConfig, BlipVisionModel

  cfg = ImageRewardConfig.full()
  abstract = nnx.eval_shape(lambda: ImageRewardModel(cfg, rngs=InitRngs(0)))
  ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  with torch.device("meta"):
    vision = BlipVisionModel(BlipVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                              num_attention_heads=16, image_size=224, patch_size=16))
    text = BlipTextModel(BlipTextConfig(vocab_size=30524, encoder_hidden_size=1024, is_decoder=True),
                         add_pooling_layer=False)
  widths = (768, 1024, 128, 64, 16, 1)
  mlp = sum(a * b + b for a, b in zip(widths, widths[1:]))
  want = sum(p.numel() for m in (vision, text) for p in m.parameters()) + mlp
  assert ours == want == 446_206_689


def test_bad_checkpoints_are_refused_before_anything_is_written(oracle, tmp_path):
  import torch

  out, _, _, tokenizer = oracle
  state = torch.load(out / "ImageReward.pt")
  cases = {
      "extra": ({**state, "blip.logit_scale": torch.zeros(())}, "blip.logit_scale"),
      "missing": ({k: v for k, v in state.items() if not k.endswith("blocks.1.mlp.fc2.bias")},
                  "blip.visual_encoder.blocks.1.mlp.fc2.bias"),
      "wrapped": ({f"module.{k}": v for k, v in state.items()}, "'module.'"),
      "other": ({"layers.0.weight": torch.zeros(2, 2)}, "not ImageReward's state_dict"),
  }
  for name, (bad, message) in cases.items():
    path = tmp_path / f"{name}.pt"
    torch.save(bad, path)
    done = subprocess.run([sys.executable, "-m", "checkpoints_convert.image_reward", f"--checkpoint={path}",
                           f"--out_dir={tmp_path / name}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    # The shared check lists every unexpected, missing and mis-shaped key, under the file's name.
    assert done.returncode == 2 and message in done.stderr and str(path) in done.stderr, (name, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert not (tmp_path / name / "params").exists()
  with pytest.raises(ValueError, match="holds no BERT tokenizer"):
    image_reward_lib.image_reward_factory(str(oracle[2]), str(tmp_path))
  with pytest.raises(ValueError, match="is not a directory"):
    image_reward_lib.image_reward_factory(str(tmp_path / "nowhere"), str(tokenizer))
