"""CLIP-based rewards and ImageReward at full size (random weights): time per image, jitted, compile excluded.

`clip_score` and `laion_aesthetic` run openai/clip-vit-large-patch14's layout (`ClipConfig.full()`, plus
the 768-1024-128-64-16-1 head), `pickscore` and `hps` the ViT-H/14 layout (`ClipConfig.vit_h14()`; `hps` with
its own preprocessing: a longest-side resize in floats and padding, `glmrl.rewards.hps.preprocessing`). Each
scores `--batch` random uint8 `--size` x `--size` images (resize + crop + normalise on device, vision
tower, projection) inside one jit that closes over the weights, as the composer runs it; the text
embeddings are prepared beforehand, and the text tower's own cost per prompt (77 tokens, paid once
per distinct prompt thanks to the cache) is timed separately. Each timing is the median of
`--repeats` calls after one compiling call (reported separately). `image_reward` runs the released ImageReward
layout (BLIP ViT-L/16 and the cross-attending bert-base, `ImageRewardConfig.full()`) on 35 prompt tokens per image,
with ImageReward's preprocessing: its text encoder runs per image, as it attends to the image.

    python bench/rewards_clip.py --size=1024 --batch=2 --repeats=3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import glmrl  # noqa: E402,F401  (first: disables flax eager sharding)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from glmrl.models.clip import ClipConfig, ClipModel, l2_normalize  # noqa: E402
from glmrl.models.clip.aesthetic import AestheticConfig, AestheticHead  # noqa: E402
from glmrl.models.clip.embedder import ClipEmbedder  # noqa: E402
from glmrl.models.clip.preprocess import ImageProcessing  # noqa: E402
from glmrl.rewards.aesthetic import make_aesthetic  # noqa: E402
from glmrl.rewards.clip_score import TEXT_EMBEDS as CLIP_TEXT, make_clip_score  # noqa: E402
from glmrl.rewards.hps import TEXT_EMBEDS as HPS_TEXT, make_hps, preprocessing as hps_preprocessing  # noqa: E402
from glmrl.rewards.pickscore import TEXT_EMBEDS as PICK_TEXT, make_pickscore  # noqa: E402
from glmrl.models.blip.config import ImageRewardConfig  # noqa: E402
from glmrl.models.blip.model import ImageRewardModel  # noqa: E402
from glmrl.rewards.image_reward import PROMPT_IDS, PROMPT_MASK, make_image_reward  # noqa: E402
from glmrl.rewards.image_reward import preprocessing as image_reward_preprocessing  # noqa: E402


def random_module(cls, cfg):
  """Random init under jit: one compiled program instead of hundreds of eager ops."""
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))
  return nnx.merge(graphdef, jax.jit(lambda: nnx.split(cls(cfg, rngs=nnx.Rngs(0)))[1])())


def timed(fn, *args, repeats):
  t = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return first, statistics.median(times)


def n_params(module) -> int:
  return sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(module, nnx.Param)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rewards", default="clip_score,laion_aesthetic,pickscore")
  parser.add_argument("--size", type=int, default=1024, help="image side in pixels (GLM-Image renders 1024)")
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  names = args.rewards.split(",")
  unknown = sorted(set(names) - {"clip_score", "laion_aesthetic", "pickscore", "hps", "image_reward"})
  if unknown:
    raise SystemExit(f"unknown rewards {unknown}")
  print(f"device: {jax.devices()[0].platform} ({os.cpu_count()} cpus); batch {args.batch} of "
        f"{args.size}x{args.size} uint8 images, {args.repeats} repeats, float32")
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (args.batch, args.size, args.size, 3), dtype=np.uint8)
  layouts = {"clip_score": "full", "laion_aesthetic": "full", "pickscore": "vit_h14", "hps": "vit_h14"}
  models = {}
  for name in names:
    if name == "image_reward":
      model = random_module(ImageRewardModel, ImageRewardConfig.full())
      print(f"[image_reward] {n_params(model) / 1e6:.1f}M params")
      reward = make_image_reward(model, None, image_reward_preprocessing(model.cfg.vision.image_size))
      tokens = model.cfg.max_prompt_tokens
      metadata = {PROMPT_IDS: jnp.asarray(rng.integers(0, 30522, (args.batch, tokens)), jnp.int32),
                  PROMPT_MASK: jnp.ones((args.batch, tokens), jnp.int32)}
      _report(name, reward, images, metadata, args)
      continue
    layout = layouts[name]
    if layout not in models:
      cfg = getattr(ClipConfig, layout)()
      model = models[layout] = random_module(ClipModel, cfg)
      ids = jnp.asarray(rng.integers(0, 49406, (1, 77)), jnp.int32)
      text = jax.jit(lambda s, i, g=nnx.graphdef(model): l2_normalize(nnx.merge(g, s).text_features(i)))
      first, med = timed(text, nnx.state(model), ids, repeats=args.repeats)
      print(f"[{layout}] {n_params(model) / 1e6:.1f}M params; text tower per prompt: {med:.3f} s "
            f"(first call {first:.2f} s)")
    model = models[layout]
    embedder = ClipEmbedder(model, hps_preprocessing(model.cfg.vision.image_size) if name == "hps"
                            else ImageProcessing.full())
    text_embeds = l2_normalize(jnp.asarray(rng.standard_normal((args.batch, embedder.dim)), jnp.float32))
    if name == "clip_score":
      reward, metadata = make_clip_score(embedder), {CLIP_TEXT: text_embeds}
    elif name == "pickscore":
      reward, metadata = make_pickscore(embedder), {PICK_TEXT: text_embeds}
    elif name == "hps":
      reward, metadata = make_hps(embedder), {HPS_TEXT: text_embeds}
    else:
      reward, metadata = make_aesthetic(embedder, random_module(AestheticHead, AestheticConfig.full())), {}
    _report(name, reward, images, metadata, args)


def _report(name, reward, images, metadata, args):
  score = jax.jit(lambda x, m, fn=reward.fn: fn(x, None, m))
  first, med = timed(score, images, metadata, repeats=args.repeats)
  print(f"{name}: first call {first:.2f} s (compile + run), median {med:.3f} s per batch, "
        f"{med / args.batch:.3f} s per image")


if __name__ == "__main__":
  main()
