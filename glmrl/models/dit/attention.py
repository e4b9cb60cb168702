"""The DiT's attention kernels: XLA's (the scores of all queries at once), cuDNN's, or query-blocked.

At 1024^2 one sample-layer's scores [H, S, S] (S ~ 4,350 image + glyph tokens, 32 heads) are 2.4 GB in float32,
for each CFG branch; `query_blocked` computes them `block` queries at a time (a sequential map, each block
rematerialised in the backward pass), so at most [B, H, block, S] exist at once. Every query row still takes
its softmax over all keys: the result is XLA's up to rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

IMPLS = ("xla", "cudnn", "blocked")


def attention(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK, impl: str | None, block: int):
  """Scaled dot-product attention by `impl` (None = "xla")."""
  if impl == "blocked":
    return query_blocked(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK, block)
  return jax.nn.dot_product_attention(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask=mask_Bx1x1xK,
                                      implementation=None if impl == "xla" else impl)


@functools.partial(jax.checkpoint, prevent_cse=False)
def _one_block(q_BxQxHxD, k_BxKxHxD, v_BxKxHxD, mask):
  return jax.nn.dot_product_attention(q_BxQxHxD, k_BxKxHxD, v_BxKxHxD, mask=mask)


def query_blocked(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK, block: int):
  """Attention `block` queries at a time (queries padded to whole blocks, the padding dropped)."""
  b, s, h, d = q_BxSxHxD.shape
  if s <= block:
    return _one_block(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK)
  n = -(-s // block)
  q_pad = jnp.pad(q_BxSxHxD, ((0, 0), (0, n * block - s), (0, 0), (0, 0)))
  q_NxBxQxHxD = q_pad.reshape(b, n, block, h, d).swapaxes(0, 1)
  o_NxBxQxHxD = jax.lax.map(lambda q: _one_block(q, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK), q_NxBxQxHxD)
  return o_NxBxQxHxD.swapaxes(0, 1).reshape(b, n * block, h, d)[:, :s]
