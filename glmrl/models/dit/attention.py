"""The DiT's attention kernels: XLA's (`xla`: the scores of all queries at once), cuDNN's, query-blocked, or
Pallas splash attention (TPU).

At 1024^2 one sample-layer's scores [H, S, S] (S ~ 4,350 image + glyph tokens, 32 heads) are 2.4 GB in float32,
for each CFG branch; `query_blocked` computes them `block` queries at a time (a sequential map, each block
rematerialised in the backward pass), so at most [B, H, block, S] exist at once. Every query row still takes
its softmax over all keys: the result is XLA's up to rounding. `splash` is JAX's Pallas TPU flash kernel
(jax.experimental.pallas.ops.tpu.splash_attention: online softmax over key blocks, its own backward kernels),
which never holds a score matrix in HBM; off TPU it runs in Pallas' interpreter (slow; for checking it).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

IMPLS = ("xla", "cudnn", "blocked", "splash")


def for_platform(platform: str, compute_dtype) -> str:
  """`model.dit_attention="auto"`: the flash kernel of the platform the program runs on (or compiles for):
  splash on TPU, cuDNN on NVIDIA GPUs in 16-bit compute (its only dtypes), else XLA's."""
  if platform == "tpu":
    return "splash"
  if platform in ("gpu", "cuda") and jnp.dtype(compute_dtype).itemsize == 2:
    return "cudnn"
  return "xla"


def attention(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK, impl: str | None, block: int):
  """Scaled dot-product attention by `impl` (None = "xla")."""
  if impl == "blocked":
    return query_blocked(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK, block)
  if impl == "splash":
    return splash(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK, block)
  if impl == "cudnn":
    return cudnn(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK)
  return xla(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK)


def xla(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK):
  """XLA's attention, the score matrices with heads ahead of the sequence ([B, H, S, K]): every matmul of the
  forward and of the backward is then a plain batched matrix product. (`jax.nn.dot_product_attention` contracts
  [B, S, H, D] operands directly, and its backward moves score matrices through transposes: on XLA:CPU its
  gradient took 1.7x this one's, `bench/dit_attention.py`.) As there: scores and softmax in float32 (bfloat16
  operands accumulate in float32), masked keys at a large negative score; the softmax's normalisation is applied
  to the [B, H, S, D] output rather than the [B, H, S, K] probabilities."""
  d = q_BxSxHxD.shape[-1]
  heads_major = lambda x_BxSxHxD: jnp.swapaxes(x_BxSxHxD, 1, 2)
  precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if q_BxSxHxD.dtype == jnp.bfloat16 else None
  scores_BxHxSxK = jnp.einsum("bhsd,bhkd->bhsk", heads_major(q_BxSxHxD), heads_major(k_BxKxHxD),
                              precision=precision, preferred_element_type=jnp.float32) * jnp.float32(d ** -0.5)
  if mask_Bx1x1xK is not None:
    scores_BxHxSxK = jnp.where(mask_Bx1x1xK, scores_BxHxSxK, jnp.float32(-0.7 * jnp.finfo(jnp.float32).max))
  top_BxHxSx1 = jax.lax.stop_gradient(jnp.max(scores_BxHxSxK, axis=-1, keepdims=True))  # the softmax's shift
  e_BxHxSxK = jnp.exp(scores_BxHxSxK - top_BxHxSx1)
  o_BxHxSxD = jnp.einsum("bhsk,bhkd->bhsd", e_BxHxSxK.astype(v_BxKxHxD.dtype), heads_major(v_BxKxHxD),
                         precision=precision, preferred_element_type=jnp.float32)
  o_BxHxSxD = o_BxHxSxD / jnp.sum(e_BxHxSxK, axis=-1, keepdims=True)
  return heads_major(o_BxHxSxD).astype(v_BxKxHxD.dtype)


def cudnn_operands(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK):
  """(q, k, v, key lengths [B] or None) as cuDNN's fast path takes them: the key mask as sequence lengths, each
  row's valid keys moved ahead of its masked ones (a stable order; exact, since attention without a causal mask
  does not depend on the order of the keys). cuDNN's backward needs even lengths: an odd query count gets one
  padding query (its output is dropped), an odd key count one padding key past every length."""
  b, s, _, _ = q_BxSxHxD.shape
  k_len = k_BxKxHxD.shape[1]
  if mask_Bx1x1xK is None and s % 2 == 0 and k_len % 2 == 0:
    return q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, None
  pad = lambda x_BxLxHxD: jnp.pad(x_BxLxHxD, ((0, 0), (0, x_BxLxHxD.shape[1] % 2), (0, 0), (0, 0)))
  q_BxSxHxD, k_BxKxHxD, v_BxKxHxD = pad(q_BxSxHxD), pad(k_BxKxHxD), pad(v_BxKxHxD)
  valid_BxK = (jnp.ones((b, k_len), bool) if mask_Bx1x1xK is None
               else jnp.broadcast_to(mask_Bx1x1xK, (b, 1, 1, k_len))[:, 0, 0])
  valid_BxK = jnp.pad(valid_BxK, ((0, 0), (0, k_len % 2)))
  if mask_Bx1x1xK is not None:
    order_BxK = jnp.argsort(jnp.logical_not(valid_BxK), axis=1, stable=True)
    take = lambda x_BxKxHxD: jnp.take_along_axis(x_BxKxHxD, order_BxK[:, :, None, None], axis=1)
    k_BxKxHxD, v_BxKxHxD = take(k_BxKxHxD), take(v_BxKxHxD)
  return q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, jnp.sum(valid_BxK, axis=1, dtype=jnp.int32)


def cudnn(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK):
  """cuDNN's flash attention (NVIDIA GPUs, 16-bit operands) on its fast path: no bias, the key mask as
  sequence lengths (`cudnn_operands`; `__cudnn$fmhaSoftmax` in the HLO). A boolean mask would reach cuDNN as an
  additive bias of the scores' whole [B, 1, S, K] extent (`__cudnn$fmhaScaleBiasSoftmax`), the slow path: 2.6x the
  time of the lengths' kernel for a masked 4096-token attention on an H100 (jax-ml/jax#35114)."""
  s = q_BxSxHxD.shape[1]
  q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, lengths_B = cudnn_operands(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK)
  out_BxSxHxD = jax.nn.dot_product_attention(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, key_value_seq_lengths=lengths_B,
                                             implementation="cudnn")
  return out_BxSxHxD[:, :s]


@functools.partial(jax.checkpoint, prevent_cse=False)
def _one_block(q_BxQxHxD, k_BxKxHxD, v_BxKxHxD, mask):
  return xla(q_BxQxHxD, k_BxKxHxD, v_BxKxHxD, mask)


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


_TILE = 128  # splash's sequence blocks are multiples of this


def _block(length: int, want: int) -> int:
  """The largest multiple of _TILE <= max(want, _TILE) dividing `length` (a multiple of _TILE)."""
  for size in range(max(want // _TILE, 1) * _TILE, 0, -_TILE):
    if length % size == 0:
      return size
  return _TILE


def splash(q_BxSxHxD, k_BxKxHxD, v_BxKxHxD, mask_Bx1x1xK, block: int):
  """Attention by the Pallas splash kernel: queries and keys padded to whole tiles, a key mask (and the padding)
  as segment ids (query 1, key 1 where valid, 0 elsewhere), q pre-scaled by 1/sqrt(D) (the kernel does not scale).
  Inside a mesh the kernel runs per device (shard_map: the batch over data x fsdp and heads over tensor where
  they divide), since XLA cannot partition a Pallas call."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

  from glmrl import sharding as sharding_lib

  b, s, h, d = q_BxSxHxD.shape
  k_len = k_BxKxHxD.shape[1]
  s_pad, k_pad = -(-s // _TILE) * _TILE, -(-k_len // _TILE) * _TILE
  bq, bk = _block(s_pad, block), _block(k_pad, block)
  mesh = jax.sharding.get_abstract_mesh()
  platform = jax.default_backend() if mesh.empty else mesh.abstract_device.platform
  sizes = kernel_lib.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
                                block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)
  valid_BxK = (jnp.ones((b, k_len), bool) if mask_Bx1x1xK is None
               else jnp.broadcast_to(mask_Bx1x1xK, (b, 1, 1, k_len))[:, 0, 0])
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  q_BxHxSxD = pad(q_BxSxHxD * jnp.asarray(d ** -0.5, q_BxSxHxD.dtype), s_pad)
  k_BxHxKxD, v_BxHxKxD = pad(k_BxKxHxD, k_pad), pad(v_BxKxHxD, k_pad)
  q_ids_BxS = jnp.ones((b, s_pad), jnp.int32)
  k_ids_BxK = jnp.pad(valid_BxK.astype(jnp.int32), ((0, 0), (0, k_pad - k_len)))

  def run(q, k, v, q_ids, k_ids):
    fn = kernel_lib.make_splash_mha(
        mask_lib.MultiHeadMask([mask_lib.FullMask((s_pad, k_pad))] * q.shape[1]), block_sizes=sizes, head_shards=1,
        q_seq_shards=1, interpret=platform != "tpu")
    return jax.vmap(lambda *x: fn(*x[:3], segment_ids=kernel_lib.SegmentIds(*x[3:])))(q, k, v, q_ids, k_ids)

  if mesh.empty:
    o_BxHxSxD = run(q_BxHxSxD, k_BxHxKxD, v_BxHxKxD, q_ids_BxS, k_ids_BxK)
  else:
    batch = tuple(a for a in sharding_lib.BATCH_AXES if a in mesh.axis_names)
    if b % math.prod(mesh.shape[a] for a in batch):
      batch = None  # a batch that does not split (a partly replicated micro-batch): every device computes it
    head_axis = "tensor" if "tensor" in mesh.axis_names and h % mesh.shape["tensor"] == 0 else None
    spec = jax.sharding.PartitionSpec(batch, head_axis, None, None)
    ids = jax.sharding.PartitionSpec(batch, None)
    o_BxHxSxD = jax.shard_map(run, in_specs=(spec, spec, spec, ids, ids), out_specs=spec, check_vma=False)(
        q_BxHxSxD, k_BxHxKxD, v_BxHxKxD, q_ids_BxS, k_ids_BxK)
  return o_BxHxSxD.transpose(0, 2, 1, 3)[:, :s]
