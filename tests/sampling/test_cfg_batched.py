"""Both CFG branches as one DiT forward (model.dit_cfg_batched) give the two sequential passes' guided velocity and
its gradient, float32 on the tiny DiT, within 1e-5: glyph sequences of different lengths (the shorter padded and
masked), per-sample timesteps, the prior tokens dropped on the unconditional rows only; gradients to 1e-5 of each
leaf's largest entry."""

import glmrl  # noqa: F401

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.models import glm_image
from glmrl.models.dit import DiTConfig
from glmrl.sampling import decode

B, H, W = 3, 64, 64


def test_batched_branches_match_the_sequential_ones():
  cfg = DiTConfig.tiny()
  rng = np.random.default_rng(0)
  graphdef, state = glm_image.build("dit", cfg)  # GlmImageDiT(cfg, rngs=nnx.Rngs(0))'s, by the jitted init
  cond = decode.Conditioning(
      prior_ids_BxX=jnp.asarray(rng.integers(0, cfg.prior_vq_quantizer_codebook_size, (B, (H // 16) * (W // 16)))),
      glyph_BxSxD=jnp.asarray(rng.normal(size=(B, 5, cfg.text_embed_dim)), jnp.float32),
      glyph_mask_BxS=jnp.asarray([[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False]]),
      neg_glyph_BxSxD=jnp.asarray(rng.normal(size=(B, 2, cfg.text_embed_dim)), jnp.float32),
      neg_glyph_mask_BxS=jnp.ones((B, 2), bool))
  x = jnp.asarray(rng.normal(size=(B, cfg.in_channels, H // 8, W // 8)), jnp.float32)
  size, crop = jnp.tile(jnp.array([[H, W]], jnp.float32), (B, 1)), jnp.zeros((B, 2))

  def guided(state, batched, t):
    model = nnx.merge(graphdef, state)
    model.cfg = dataclasses.replace(model.cfg, cfg_batched=batched)
    return decode.guided_velocity(model, cond, x, t, 2.5, size, crop)

  @functools.partial(jax.jit, static_argnums=1)  # jitted: op by op, this test took a minute
  def with_grad(state, batched, t):
    """The guided velocity and the gradient of its sum of squares, in one program."""
    velocity, vjp = jax.vjp(lambda s: guided(s, batched, t), state)
    return velocity, vjp(2 * velocity)[0]

  for t in (jnp.float32(700.0), jnp.asarray([900.0, 400.0, 50.0])):
    (seq, seq_grad), (both, both_grad) = with_grad(state, False, t), with_grad(state, True, t)
    np.testing.assert_allclose(np.asarray(both), np.asarray(seq), rtol=1e-5, atol=1e-5)
    # Gradients: to 1e-5 of each leaf's largest entry (the batch of 2B sums its rows in another order).
    for a, b in zip(jax.tree.leaves(both_grad), jax.tree.leaves(seq_grad)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5 * float(np.abs(b).max()) + 1e-12)
