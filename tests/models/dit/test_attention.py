"""Query-blocked and Pallas splash attention (TPU's kernel, here in Pallas' interpreter) equal XLA's (float32,
1e-5) in value and gradient, also per device on a mesh of 8 host devices for splash; blocked never holds all
queries' scores, and the DiT built with either matches diffusers like the default kernel does."""

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl.models.dit import DiTConfig
from glmrl.models.dit.attention import attention
from tests.cli import TIMEOUT_S
from tests.models.dit import torch_ref
from tests.models.dit.test_model import TOL

B, S, C, H, D, BLOCK = 2, 37, 5, 3, 8, 8  # 37 queries: 5 blocks of 8, the last padded


def _qkv_mask():
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((B, C + S, H, D)), jnp.float32)  # cached keys first, as the i2i pass
  v = jnp.asarray(rng.standard_normal((B, C + S, H, D)), jnp.float32)
  valid = rng.random((B, C + S)) < 0.8
  valid[:, 0] = True
  return q, k, v, jnp.asarray(valid)[:, None, None, :]


@pytest.mark.parametrize("impl", ["blocked", "splash"])
def test_kernel_equals_xla_in_value_and_gradient(impl):
  q, k, v, mask = _qkv_mask()
  cot = jnp.asarray(np.random.default_rng(1).standard_normal((B, S, H, D)), jnp.float32)

  def loss(impl):
    return lambda q, k, v: jnp.sum(attention(q, k, v, mask, impl, BLOCK) * cot)

  np.testing.assert_allclose(attention(q, k, v, mask, impl, BLOCK), attention(q, k, v, mask, "xla", BLOCK),
                             atol=1e-5)
  got = jax.grad(loss(impl), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss("xla"), argnums=(0, 1, 2))(q, k, v)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=1e-5)


def test_splash_per_device_on_a_mesh(tmp_path):
  """On 8 host devices (data 2 x fsdp 2 x tensor 2), inside jit: the kernel runs per device (batch and heads split)
  and equals XLA's kernel on the same mesh."""
  import subprocess
  import sys

  from tests.train.common import ROOT

  script = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"  # 8 host devices, also where a GPU is the default backend
import glmrl, jax, jax.numpy as jnp, numpy as np
from glmrl import sharding
from glmrl.models.dit.attention import attention
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.standard_normal((4, 150, 4, 16)), jnp.float32) for _ in range(3))
valid = jnp.asarray(rng.random((4, 150)) < 0.8).at[:, 0].set(True)[:, None, None, :]
mesh = sharding.make_mesh(2, 2, 2)
with jax.set_mesh(mesh):
  run = lambda impl: jax.jit(lambda q, k, v: attention(q, k, v, valid, impl, 128))(q, k, v)
  print(float(jnp.max(jnp.abs(run("splash") - run("xla")))))
"""
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert out.returncode == 0, out.stderr[-3000:]
  assert float(out.stdout.strip().splitlines()[-1]) < 1e-5


def _attention_f64(q, k, v, valid_BxK, cot):
  """Softmax attention and its gradient written out in float64 numpy, [B, S, H, D] operands: (out, dq, dk, dv)
  of sum(out * cot)."""
  q, k, v, cot = (np.asarray(x, np.float64).transpose(0, 2, 1, 3) for x in (q, k, v, cot))  # [B, H, S, D]
  scale = q.shape[-1] ** -0.5
  scores = np.where(valid_BxK[:, None, None, :], q @ k.swapaxes(-1, -2) * scale, -np.inf)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  dp = cot @ v.swapaxes(-1, -2)
  ds = p * (dp - (dp * p).sum(-1, keepdims=True))
  back = lambda x: x.transpose(0, 2, 1, 3)
  return back(p @ v), back(ds @ k * scale), back(ds.swapaxes(-1, -2) @ q * scale), back(p.swapaxes(-1, -2) @ cot)


def test_xla_kernel_equals_float64_attention_in_value_and_gradient():
  """Our XLA kernel (heads-major scores, normalised after the value product) against the formula in float64:
  value and the gradients of q, k and v (float32, 1e-5); bfloat16 operands within bfloat16's rounding."""
  from glmrl.models.dit import attention as attention_lib

  q, k, v, mask = _qkv_mask()
  cot = jnp.asarray(np.random.default_rng(1).standard_normal((B, S, H, D)), jnp.float32)
  want = _attention_f64(q, k, v, np.asarray(mask[:, 0, 0]), cot)
  got = jax.value_and_grad(lambda q, k, v: jnp.sum(attention_lib.xla(q, k, v, mask) * cot), argnums=(0, 1, 2))
  out = attention_lib.xla(q, k, v, mask)
  np.testing.assert_allclose(out, want[0], atol=1e-5)
  for g, w in zip(got(q, k, v)[1], want[1:]):
    np.testing.assert_allclose(g, w, atol=1e-5)
  bf16 = attention_lib.xla(*(x.astype(jnp.bfloat16) for x in (q, k, v)), mask)
  assert bf16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(bf16, np.float32), want[0], atol=2 ** -6)


@pytest.mark.parametrize("layout", ["tiny", "released"])
def test_cudnn_operands_as_lengths_equal_the_masked_attention(layout):
  """cuDNN's fast path takes the key mask as sequence lengths (`cudnn_operands`: valid keys first, even lengths).
  With those operands JAX's XLA kernel, given the same lengths, equals our masked XLA kernel in value and in the
  q, k, v gradients (float32, 1e-5): for the tiny case's odd and even counts of queries and keys, with a scattered
  mask, cached keys first and no mask; at the released 1024^2 layout (256 glyph tokens of which 37 are text, then
  the 4096 image tokens; 2 of the 32 heads of 128), as the DiT masks it."""
  from glmrl.models.dit import attention as attention_lib

  def check(q, k, v, mask, atol):
    cot = jnp.asarray(np.random.default_rng(3).standard_normal(q.shape), jnp.float32)

    def lengths_path(q, k, v):
      *operands, lengths = attention_lib.cudnn_operands(q, k, v, mask)
      assert operands[0].shape[1] % 2 == 0 and operands[1].shape[1] % 2 == 0
      out = jax.nn.dot_product_attention(*operands, key_value_seq_lengths=lengths, implementation="xla")
      return jnp.sum(out[:, :q.shape[1]] * cot)

    masked = lambda q, k, v: jnp.sum(attention_lib.xla(q, k, v, mask) * cot)
    got, want = (jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, v) for f in (lengths_path, masked))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(g, w, atol=atol, rtol=1e-5)

  if layout == "tiny":
    q, k, v, mask = _qkv_mask()  # 37 queries, 42 keys
    for s, n in ((S, C + S), (S - 1, C + S - 1), (S, C + S - 1)):
      for m in (mask[..., :n], None):
        check(q[:, :s], k[:, :n], v[:, :n], m, 1e-5)
    return
  rng = np.random.default_rng(4)
  t, x, h, d = 256, 64 * 64, 2, 128
  q, k, v = (jnp.asarray(rng.standard_normal((1, t + x, h, d)), jnp.float32) for _ in range(3))
  valid = np.ones((1, t + x), bool)
  valid[:, 37:t] = False  # the glyph tokens past the prompt's text
  check(q, k, v, jnp.asarray(valid)[:, None, None, :], 1e-5)


on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's flash kernel runs on NVIDIA GPUs only")


@on_gpu
def test_cudnn_kernel_in_bfloat16_is_as_accurate_as_xlas():
  """On a GPU, bfloat16 operands: cuDNN's kernel's value and q, k, v gradients are at most twice as far from the
  float64 formula as our XLA kernel's in bfloat16 (both are bounded by bfloat16's rounding, not by 1e-5)."""
  rng = np.random.default_rng(2)
  b, s, c, h, d = 2, 201, 7, 4, 64  # cuDNN: head dim a multiple of 8; odd lengths are padded
  q, k, v, cot = (jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
                  for shape in ((b, s, h, d), (b, c + s, h, d), (b, c + s, h, d), (b, s, h, d)))
  valid_BxK = rng.random((b, c + s)) < 0.8
  valid_BxK[:, 0] = True
  mask = jnp.asarray(valid_BxK)[:, None, None, :]
  want = _attention_f64(q, k, v, valid_BxK, cot)

  def errors(impl):
    fn = lambda q, k, v: jnp.sum((attention(q, k, v, mask, impl, BLOCK) * cot).astype(jnp.float32))
    out = attention(q, k, v, mask, impl, BLOCK)
    assert out.dtype == jnp.bfloat16
    got = (out, *jax.grad(fn, argnums=(0, 1, 2))(q, k, v))
    return [float(np.max(np.abs(np.asarray(g, np.float64) - w))) for g, w in zip(got, want)]

  for name, cudnn, xla in zip(("value", "dq", "dk", "dv"), errors("cudnn"), errors("xla")):
    assert cudnn <= 2 * xla, (name, cudnn, xla)


@on_gpu
def test_dit_with_cudnn_in_bfloat16_matches_reference_as_xla_does(ref_model):
  """On a GPU, the tiny DiT in bfloat16 with cuDNN's kernel is at most twice as far from diffusers (float32) as
  the same DiT with XLA's kernel."""
  import dataclasses

  cfg = DiTConfig.tiny(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  inputs = torch_ref.t2i_inputs(cfg, seed=1, batch=2, height=8, width=12, text_len=5)
  want = torch_ref.ref_forward(ref_model, **inputs, prior_token_drop=np.zeros(inputs["prior_token_ids"].shape, bool))
  error = {impl: torch_ref.max_abs(torch_ref.forward(torch_ref.ported(
      ref_model, dataclasses.replace(cfg, attention_impl=impl)), inputs, prior_token_drop=False), want)
      for impl in ("xla", "cudnn")}
  assert error["cudnn"] <= 2 * error["xla"], error


def _shapes(jaxpr, acc):
  for eqn in jaxpr.eqns:
    acc.extend(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
    for param in eqn.params.values():
      for inner in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          _shapes(inner, acc)
  return acc


@pytest.mark.parametrize("impl,whole", [("blocked", False), ("xla", True)])
def test_only_xla_holds_every_querys_scores(impl, whole):
  """Forward and backward: a [.., S, C + S] score array appears with XLA's kernel only."""
  q, k, v, mask = _qkv_mask()
  jaxpr = jax.make_jaxpr(jax.grad(lambda q: jnp.sum(attention(q, k, v, mask, impl, BLOCK))))(q).jaxpr
  shapes = _shapes(jaxpr, [])
  assert any(s[-2:] == (S, C + S) for s in shapes) is whole
  if not whole:
    assert any(s[-2:] == (BLOCK, C + S) for s in shapes)


@pytest.mark.parametrize("impl", ["blocked", "splash"])
def test_dit_with_the_kernel_matches_reference(ref_model, impl):
  """The tiny DiT's 29 tokens in blocks of 4 (the last padded; splash: one tile of 128), against diffusers."""
  cfg = DiTConfig.tiny(attention_impl=impl, attention_block=4)
  inputs = torch_ref.t2i_inputs(cfg, seed=1, batch=2, height=8, width=12, text_len=5)
  model = torch_ref.ported(ref_model, cfg)
  want = torch_ref.ref_forward(ref_model, **inputs, prior_token_drop=np.zeros(inputs["prior_token_ids"].shape, bool))
  got = torch_ref.forward(model, inputs, prior_token_drop=False)
  assert torch_ref.max_abs(got, want) < TOL


@pytest.mark.parametrize("platform,dtype,impl", [("tpu", jnp.float32, "splash"), ("gpu", jnp.bfloat16, "cudnn"),
                                                 ("gpu", jnp.float32, "xla"), ("cpu", jnp.bfloat16, "xla")])
def test_auto_picks_the_platforms_kernel(platform, dtype, impl):
  from glmrl.models.dit import attention as attention_lib

  assert attention_lib.for_platform(platform, dtype) == impl


def test_auto_resolves_for_the_run_and_for_a_tpu_compile():
  from glmrl.programs import plan
  from tests.train.common import tiny_config

  config = tiny_config(model__dit_attention="auto")
  assert plan.model_configs(config).dit.attention_impl is None  # this CPU: XLA's
  assert plan.model_configs(config, platform="tpu").dit.attention_impl == "splash"
