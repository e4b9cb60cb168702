"""Teacher-forced log-probs: sampling filters as transformers' warpers, on-policy equality, gradients."""

import glmrl  # noqa: F401

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import GlmImageConfig, GlmImageForConditionalGeneration
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.prompt import PromptProcessor
from glmrl.sampling import ar_sampler, logprobs
from glmrl.sampling.logprobs import SamplingConfig, TokenRule
from tests.fixtures.tiny_glm_image import ar_from_reference, write_processor

CFG = ARConfig.tiny()
PROMPTS = ["a red cat", "a small blue house on the tree"]  # the shapes test_ar_sampler compiles
CHUNK = 100  # does not divide the 261 generated tokens


@pytest.fixture(scope="module")
def model():
  torch.manual_seed(0)
  return ar_from_reference(GlmImageForConditionalGeneration(GlmImageConfig(**CFG.to_hf())).eval(), CFG)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
  return PromptProcessor.from_pretrained(write_processor(tmp_path_factory.mktemp("ckpt")))(PROMPTS, 64, 96)


@functools.partial(nnx.jit, static_argnames=("prompt_len", "layout", "cfg", "chunk_size", "remat"))
def _recompute(model, seq, pos, valid, *, prompt_len, layout, cfg, chunk_size, remat):
  return logprobs.teacher_forced_logprobs(model, seq, pos, valid, prompt_len=prompt_len, layout=layout, cfg=cfg,
                                 chunk_size=chunk_size, remat=remat)


def _recompute_sample(model, out, cfg, chunk_size=CHUNK, remat=True, seq=None):
  return _recompute(model, out.sequence_ids if seq is None else seq, out.positions, out.valid,
                    prompt_len=out.prompt_len, layout=out.layout, cfg=cfg, chunk_size=chunk_size, remat=remat)


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=1.3, top_k=5, top_p=0.9),
                                 SamplingConfig(temperature=0.7, top_k=3, top_p=1.0, constrain_to_codebook=False)],
                         ids=["default", "topk_topp", "topk_unconstrained"])
def test_filters_match_transformers_warpers(cfg):
  """Kept set and log-probs equal those after generate's processors (rule, temperature, top-k, top-p)."""
  rng = np.random.default_rng(0)
  n, vocab = 6, CFG.text.vision_vocab_size
  logits = (3 * rng.standard_normal((2, n, vocab))).astype(np.float32)
  rule = TokenRule(num_new_tokens=n, codebook_size=CFG.vq.num_embeddings, end_id=CFG.text.eos_token_id,
                   enabled=cfg.constrain_to_codebook)
  steps = np.arange(n)
  keep = np.asarray(logprobs.filter_mask(jnp.asarray(logits), jnp.asarray(steps)[None], cfg, rule))
  warpers = LogitsProcessorList([TemperatureLogitsWarper(cfg.temperature)]
                                + ([TopKLogitsWarper(cfg.top_k)] if cfg.top_k else [])
                                + ([TopPLogitsWarper(cfg.top_p)] if cfg.top_p < 1 else []))
  for j in steps:
    scores = torch.from_numpy(logits[:, j])
    if cfg.constrain_to_codebook:
      allowed = np.asarray(rule.allowed(jnp.asarray(j), vocab))
      scores = scores.masked_fill(torch.from_numpy(~allowed), -float("inf"))
    processed = warpers(None, scores)
    np.testing.assert_array_equal(keep[:, j], torch.isfinite(processed).numpy())
    tokens = processed.argmax(-1)
    expected = torch.log_softmax(processed, -1).gather(-1, tokens[:, None])[:, 0].numpy()
    got = logprobs.masked_logprobs(jnp.asarray(logits[:, j]), jnp.asarray(tokens.numpy()), jnp.asarray(keep[:, j]),
                                   cfg.temperature)
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-6, rtol=0)


def _sorted_top_p_keep(scaled, top_p):
  """float64 reference of the sort-based rule: ascending cumulative mass <= 1 - p goes, ties of the first kept stay."""
  out = np.zeros(scaled.shape, bool)
  for i, row in enumerate(scaled.astype(np.float64)):
    srt = np.sort(row)
    p = np.exp(srt - srt.max())
    cum = np.cumsum(p / p.sum())
    first = min(int(np.sum(cum <= 1.0 - top_p)), len(row) - 1)
    out[i] = row >= srt[first]
  return out


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.75, 0.9, 0.999])
def test_top_p_without_a_sort_keeps_what_the_sort_keeps(top_p):
  """The bisection threshold keeps exactly the sort's set (ties included) on spread, peaked, tied, masked and
  constant rows of the released vision vocabulary's size."""
  rng = np.random.default_rng(int(top_p * 1000))
  v = 16_512
  rows = [3 * rng.standard_normal(v), 0.3 * rng.standard_normal(v), np.round(2 * rng.standard_normal(v)) / 2,
          np.zeros(v), np.r_[40.0, rng.standard_normal(v - 1)]]
  masked = 3 * rng.standard_normal(v)
  masked[rng.random(v) < 0.7] = -np.inf  # the codebook rule's -inf entries
  scaled = np.stack(rows + [masked]).astype(np.float32)
  keep = logprobs._order_keys(jnp.asarray(scaled)) >= logprobs.top_p_threshold(jnp.asarray(scaled), top_p)
  np.testing.assert_array_equal(np.asarray(keep), _sorted_top_p_keep(scaled, top_p))


def test_on_policy_logprobs_equal_sampler(model, batch):
  """Recomputed log-probs equal the sampler's within 1e-5 (float32), chunked and rematerialised."""
  cfg = SamplingConfig()
  out = ar_sampler.sample(model, batch, jax.random.split(jax.random.key(3), 2), cfg)
  recomputed = np.asarray(_recompute_sample(model, out, cfg))
  assert recomputed.shape == out.tokens.shape
  np.testing.assert_allclose(recomputed, np.asarray(out.logprobs), atol=1e-5, rtol=0)
  # A token the codebook rule forbids has probability 0.
  seq = np.array(out.sequence_ids)
  seq[0, out.prompt_len + 5] = CFG.text.vision_vocab_size - 1
  off = np.asarray(_recompute_sample(model, out, cfg, seq=jnp.asarray(seq)))
  assert off[0, 5] == -np.inf and np.isfinite(np.delete(off[0], 5)).all()


def test_on_policy_other_filters(model, batch):
  cfg = SamplingConfig(temperature=1.3, top_k=8, top_p=0.9, constrain_to_codebook=False)
  out = ar_sampler.sample(model, batch, jax.random.split(jax.random.key(4), 2), cfg)
  recomputed = np.asarray(_recompute_sample(model, out, cfg, chunk_size=64))
  np.testing.assert_allclose(recomputed, np.asarray(out.logprobs), atol=1e-5, rtol=0)


def test_gradients_and_remat(model, batch):
  cfg = SamplingConfig()
  out = ar_sampler.sample(model, batch, jax.random.split(jax.random.key(3), 2), cfg)

  def loss(m, remat):
    lp = logprobs.sample_logprobs(m, out, cfg, chunk_size=CHUNK, remat=remat)
    return jnp.mean(lp), lp

  grads, lp = nnx.jit(nnx.grad(functools.partial(loss, remat=True), has_aux=True))(model)
  grads_plain, lp_plain = nnx.jit(nnx.grad(functools.partial(loss, remat=False), has_aux=True))(model)
  np.testing.assert_allclose(np.asarray(lp), np.asarray(lp_plain), atol=1e-6, rtol=0)
  flat = dict(nnx.to_flat_state(grads))
  flat_plain = dict(nnx.to_flat_state(grads_plain))
  for path in (("lm_head", "kernel"), ("text", "embed", "embedding"), ("text", "layers", 0, "attn", "q", "kernel")):
    g, g_plain = np.asarray(flat[path][...]), np.asarray(flat_plain[path][...])
    assert np.isfinite(g).all() and np.abs(g).max() > 0, path
    np.testing.assert_allclose(g, g_plain, atol=1e-6, rtol=1e-5)


def test_no_full_logits_and_remat_in_jaxpr(model, batch):
  """With chunking and remat, no intermediate of the gradient holds more than one chunk of [B, *, V] logits."""
  cfg = SamplingConfig()
  out = ar_sampler.sample(model, batch, jax.random.split(jax.random.key(3), 2), cfg)
  graphdef, state = nnx.split(model)
  b, vocab = out.tokens.shape[0], CFG.text.vision_vocab_size

  def inspect(remat):
    def loss(state):
      m = nnx.merge(graphdef, state)
      return jnp.mean(logprobs.sample_logprobs(m, out, cfg, chunk_size=CHUNK, remat=remat))

    sizes, primitives = [], set()

    def walk(jx):
      for eqn in jx.eqns:
        primitives.add(eqn.primitive.name)
        for var in eqn.outvars:
          shape = getattr(var.aval, "shape", ())
          if shape and shape[-1] == vocab:
            sizes.append(int(np.prod(shape[:-1])))
        for sub in _subjaxprs(eqn):
          walk(sub)

    walk(jax.make_jaxpr(jax.grad(loss))(state).jaxpr)
    return max(sizes), any(p.startswith(("remat", "checkpoint")) for p in primitives)

  largest, has_remat = inspect(remat=True)
  assert largest <= b * CHUNK and has_remat
  # Without remat the backward pass keeps every chunk's logits: the full [chunks, B, CHUNK, V].
  largest, has_remat = inspect(remat=False)
  assert largest > b * CHUNK and not has_remat


def _subjaxprs(eqn):
  for value in eqn.params.values():
    for v in value if isinstance(value, (list, tuple)) else (value,):
      if hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
        yield v.jaxpr
      elif hasattr(v, "eqns"):
        yield v


def test_bad_input_raises(model, batch):
  cfg = SamplingConfig()
  out = ar_sampler.sample(model, batch, jax.random.split(jax.random.key(3), 2), cfg)
  with pytest.raises(ValueError, match="prompt_len"):
    logprobs.teacher_forced_logprobs(model, out.sequence_ids[:, 1:], out.positions[:, :, 1:], out.valid[:, 1:],
                            prompt_len=out.prompt_len, layout=out.layout, cfg=cfg)
  with pytest.raises(ValueError, match="chunk_size=0"):
    logprobs.sample_logprobs(model, out, cfg, chunk_size=0)
  with pytest.raises(ValueError, match="positions"):
    logprobs.teacher_forced_logprobs(model, out.sequence_ids, out.positions[:2], out.valid, prompt_len=out.prompt_len,
                            layout=out.layout, cfg=cfg)
