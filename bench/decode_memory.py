"""Decoder memory with and without `sampling.decode_batch`: temp bytes of the compiled denoise+decode program.

python bench/decode_memory.py   (tiny DiT + VAE, 512 x 512, CPU compile, memory_analysis; no weights)
"""
import glmrl, jax, jax.numpy as jnp
from flax import nnx
from glmrl.models import glm_image
from glmrl.sampling import decode
configs = glm_image.preset_configs("tiny")
dd, dp = glm_image.abstract_model("dit", configs.dit)
vd, vp = glm_image.abstract_model("vae", configs.vae)
H = W = 512
S = jax.ShapeDtypeStruct
def mem(b):
  n = (H // 16) * (W // 16)
  d = configs.glyph.d_model
  cond = decode.Conditioning(S((b, n), jnp.int32), S((b, 16, d), jnp.float32), S((b, 16), bool), S((b, 16, d), jnp.float32), S((b, 16), bool))
  lat = S((b, configs.dit.in_channels, H // 8, W // 8), jnp.float32)
  c = decode.denoise_and_decode.lower(dd, dp, vd, vp, cond, lat, S((2,), jnp.float32), S((3,), jnp.float32), 1.5, S((b, 2), jnp.float32), S((b, 2), jnp.float32), None).compile()
  m = c.memory_analysis()
  return m.temp_size_in_bytes
for b in (16, 4):
  print(b, mem(b) / 2**20, "MiB temp")
