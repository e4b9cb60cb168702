"""The DiT's XLA attention (`glmrl.models.dit.attention.xla`) against `jax.nn.dot_product_attention` and torch's
`scaled_dot_product_attention` (what diffusers' DiT calls), forward and gradient, in one interleaved run.

    python -m bench.dit_attention [--batch 8 --tokens 272 --heads 4 --head_dim 32 --glyph 16 --reps 21
                                   --single_thread]

Each side attends over the same [B, S, H, D] float32 queries, keys and values with the first --glyph keys of each
sample partly masked (as the DiT's padded glyph tokens); the gradient is of sum(out * cotangent) with respect to
q, k and v. The defaults are one CFG pair of `bench/decoder_update.py`'s DiT (B = 2 x 4 samples at 256 x 256: 256
image + 16 glyph tokens, 4 heads of 32). Prints the median milliseconds and each kernel's time over ours; also the
largest difference from ours in value and gradient.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--tokens", type=int, default=272, help="sequence length S (glyph + image tokens)")
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--head_dim", type=int, default=32)
  p.add_argument("--glyph", type=int, default=16, help="leading keys of which the second half is masked")
  p.add_argument("--reps", type=int, default=21)
  p.add_argument("--single_thread", action="store_true", help="one intra-op thread for XLA and torch")
  return p.parse_args()


ARGS = parse_args()
from bench import threads  # noqa: E402

THREADS = threads.limit(1 if ARGS.single_thread else 0)  # before jax starts

import glmrl  # noqa: E402,F401

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.timing import interleaved_medians  # noqa: E402
from glmrl.models.dit import attention as attention_lib  # noqa: E402


def main(args):
  b, s, h, d = args.batch, args.tokens, args.heads, args.head_dim
  rng = np.random.default_rng(0)
  q, k, v, cot = (rng.standard_normal((b, s, h, d)).astype(np.float32) for _ in range(4))
  valid_BxK = np.ones((b, s), bool)
  valid_BxK[:, args.glyph // 2:args.glyph] = False
  mask = jnp.asarray(valid_BxK)[:, None, None, :]

  def jax_pair(fn):
    loss = lambda q, k, v: jnp.sum(fn(q, k, v) * cot)
    return jax.jit(fn), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

  ours = jax_pair(lambda q, k, v: attention_lib.xla(q, k, v, mask))
  jax_nn = jax_pair(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask))
  qj, kj, vj = (jnp.asarray(x) for x in (q, k, v))

  # torch: [B, H, S, D] as diffusers' attention processor calls it, the mask as a boolean [B, 1, 1, K].
  qt, kt, vt = (torch.from_numpy(x).transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
  cot_t = torch.from_numpy(cot).transpose(1, 2)
  mask_t = torch.from_numpy(valid_BxK)[:, None, None, :]
  sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask_t)

  def torch_grad():
    for x in (qt, kt, vt):
      x.grad = None
    (sdpa() * cot_t).sum().backward()

  def torch_forward():
    with torch.no_grad():
      sdpa()

  block = jax.block_until_ready
  runs = {
      "ours: forward": lambda: block(ours[0](qj, kj, vj)),
      "ours: gradient": lambda: block(ours[1](qj, kj, vj)),
      "jax.nn.dot_product_attention: forward": lambda: block(jax_nn[0](qj, kj, vj)),
      "jax.nn.dot_product_attention: gradient": lambda: block(jax_nn[1](qj, kj, vj)),
      "torch sdpa: forward": torch_forward,
      "torch sdpa: gradient": torch_grad,
  }
  ms = dict(zip(runs, (1e3 * t for t in interleaved_medians(list(runs.values()), args.reps, warmup=True))))

  out, grads = np.asarray(ours[0](qj, kj, vj)), [np.asarray(g) for g in ours[1](qj, kj, vj)]
  diffs = {"jax.nn.dot_product_attention": (jax_nn[0](qj, kj, vj), jax_nn[1](qj, kj, vj))}
  torch_grad()
  diffs["torch sdpa"] = (sdpa().detach().transpose(1, 2).numpy(), [x.grad.transpose(1, 2).numpy() for x in (qt, kt, vt)])
  print(f"jax {jax.__version__}, torch {torch.__version__}; threads: {THREADS}; B={b} S={s} H={h} D={d}, float32, "
        f"median of {args.reps}, interleaved")
  print("| kernel | forward ms | gradient ms | forward / ours | gradient / ours | max diff value (gradient) |")
  print("| --- | ---: | ---: | ---: | ---: | ---: |")
  for name in ("ours", "jax.nn.dot_product_attention", "torch sdpa"):
    f, g = ms[f"{name}: forward"], ms[f"{name}: gradient"]
    if name == "ours":
      diff = ""
    else:
      value, grad = diffs[name]
      diff = (f"{np.abs(np.asarray(value) - out).max():.1e} "
              f"({max(np.abs(np.asarray(x) - y).max() for x, y in zip(grad, grads)):.1e})")
    print(f"| {name} | {f:.2f} | {g:.2f} | {f / ms['ours: forward']:.2f} | {g / ms['ours: gradient']:.2f} | {diff} |")


if __name__ == "__main__":
  main(ARGS)
