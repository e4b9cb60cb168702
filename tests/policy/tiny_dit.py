"""The decoder policies' test subject: a tiny random DiT with rank-4 adapters (B non-zero) and a batch's
conditioning, the same for the Flow-GRPO and the DiffusionNFT / AWM update tests."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from glmrl.models import lora as lora_lib
from glmrl.models import glm_image
from glmrl.models.dit import DiTConfig
from glmrl.sampling import decode


def adapted_dit(batch: int, height: int, width: int):
  """(DiT config, graphdef, adapters, base, conditioning of `batch` rows, the numpy rng to draw further inputs
  from). The adapters' B is non-zero: they change the velocity, so KL terms and gradients wrt A are not trivially
  zero."""
  dit_cfg = DiTConfig.tiny()
  dit = nnx.merge(*glm_image.build("dit", dit_cfg, seed=0))  # GlmImageDiT(dit_cfg, rngs=nnx.Rngs(0))'s, jitted
  lora_lib.apply_lora(dit, lora_lib.LoraConfig(rank=4, alpha=8.0, targets=lora_lib.DIT_TARGETS), nnx.Rngs(2))
  graphdef, adapters, base = nnx.split(dit, lora_lib.LoraParam, ...)
  adapters = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(3), x.shape), adapters)
  rng = np.random.default_rng(0)
  grid = rng.integers(0, dit_cfg.prior_vq_quantizer_codebook_size, size=(batch, height // 32, width // 32))
  glyph = jnp.asarray(rng.normal(size=(batch, 5, dit_cfg.text_embed_dim)), jnp.float32)
  ones = jnp.ones((batch, 5), bool)
  cond = decode.Conditioning(decode.upsample_prior_tokens(jnp.asarray(grid)), glyph, ones, -glyph, ones)
  return dit_cfg, graphdef, adapters, base, cond, rng
