import pytest

from glmrl import sharding


def test_mesh_shape_resolves_the_rest():
  assert sharding.mesh_shape(1, -1, 1, 8) == (1, 8, 1)
  assert sharding.mesh_shape(2, 2, -1, 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    sharding.mesh_shape(-1, -1, 1, 8)
  with pytest.raises(ValueError, match="does not divide 8 devices"):
    sharding.mesh_shape(3, -1, 1, 8)
  with pytest.raises(ValueError, match=r"data=2 x fsdp=2 x tensor=1 != 8 devices"):
    sharding.mesh_shape(2, 2, 1, 8)


class FakeMesh:
  shape = {"data": 2, "fsdp": 2, "tensor": 2}


def test_logical_to_spec_replicates_what_does_not_divide():
  mesh = FakeMesh()
  assert tuple(sharding.logical_to_spec(("embed", "mlp"), (64, 6), mesh)) == ("fsdp", "tensor")
  assert tuple(sharding.logical_to_spec(("embed", "mlp"), (63, 6), mesh)) == (None, "tensor")
  # Two dims mapping to one mesh axis: only the first is sharded.
  assert tuple(sharding.logical_to_spec(("heads", "mlp"), (8, 8), mesh)) == ("tensor", None)
  assert tuple(sharding.logical_to_spec(None, (4, 4), mesh)) == (None, None)


def test_per_device_samples_splits_rows_over_batch_devices_and_keeps_the_vae_exact():
  """On 8 host devices (data 2 x fsdp 2 x tensor 2), inside jit: `fn` sees each batch device's rows (8 rows over
  4 batch devices: 2 each; tensor pairs share theirs) with the replicated argument whole; 6 rows, which 4 devices
  do not divide, are padded to 8 (2 each) and the padding's results dropped. The VAE through it equals the VAE
  without a mesh (float32, 1e-5): the decoder program's decode (`decode.decode_images`, uint8 within one level)
  and the image-to-image encode (`decode.encode_latents`)."""
  import subprocess
  import sys

  from tests.cli import ROOT, TIMEOUT_S

  script = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"  # 8 host devices, also where a GPU is the default backend
import functools, glmrl, jax, jax.numpy as jnp, numpy as np
from flax import nnx
from glmrl import sharding
from glmrl.models import glm_image
from glmrl.models.vae import VAEConfig
from glmrl.sampling import decode
rows = lambda w, x: x * w.sum() + x.shape[0]
w, x = jnp.ones((3,)), jnp.zeros((8, 5))
vae_def, vae_state = glm_image.build("vae", VAEConfig.tiny(block_out_channels=(8, 8, 16, 16)))  # jitted init
vae = nnx.merge(vae_def, vae_state)
latents = jnp.asarray(np.random.default_rng(0).standard_normal((8, vae.cfg.latent_channels, 4, 4)), jnp.float32)
decode_f32 = lambda s, z: vae.decode_normalized(jnp.transpose(z, (0, 2, 3, 1)))
want = jax.jit(decode_f32)(vae_state, latents)
with jax.set_mesh(sharding.make_mesh(2, 2, 2)):
  per_device = jax.jit(lambda w, x: sharding.per_device_samples(rows, w, x))
  print(float(per_device(w, x)[0, 0]), float(per_device(w, x[:6])[0, 0]), per_device(w, x[:6]).shape[0])
  got = jax.jit(lambda s, z: sharding.per_device_samples(lambda s, z: nnx.merge(vae_def, s).decode_normalized(
      jnp.transpose(z, (0, 2, 3, 1))), s, z))(vae_state, latents)
  images = jax.jit(lambda s, z: sharding.per_device_samples(functools.partial(decode.decode_images, vae_def), s, z))(
      vae_state, latents)
  pixels = jnp.tanh(want)  # 8 images in [-1, 1]
  encoded = jax.jit(lambda s, x: sharding.per_device_samples(functools.partial(decode.encode_latents, vae_def), s, x))(
      vae_state, pixels)
print(float(jnp.max(jnp.abs(got - want))), int(jnp.max(jnp.abs(images.astype(int) - decode.to_uint8(want).astype(int)))))
print(float(jnp.max(jnp.abs(encoded - jax.jit(functools.partial(decode.encode_latents, vae_def))(vae_state, pixels)))))
"""
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert out.returncode == 0, out.stderr[-3000:]
  first, last, encoded_gap = out.stdout.strip().splitlines()[-3:]
  assert first.split() == ["2.0", "2.0", "6"]
  gap, uint8_gap = last.split()
  assert float(gap) < 1e-5 and int(uint8_gap) <= 1  # a value 1e-6 from a rounding boundary may take either level
  assert float(encoded_gap) < 1e-5


def _params(**shapes):
  """An abstract nnx State: name -> (shape, logical names), float32."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  return nnx.State({k: nnx.Param(jax.ShapeDtypeStruct(shape, jnp.float32), out_sharding=names)
                    for k, (shape, names) in shapes.items()})


def test_undivided_names_each_parameter_replicated_over_an_axis_it_does_not_divide(caplog):
  """A size its axis does not divide is named with the bytes per chip it adds; a size that divides, a dimension
  without a rule, and an axis another dimension already took are not."""
  state = _params(split=((64, 6), ("embed", "mlp")), odd=((63, 6), ("embed", "mlp")),
                  free=((7, 5), (None, "conv_in")), taken=((8, 8), ("heads", "mlp")),
                  big=((2001, 1024), ("embed", "mlp")))
  found = {u.path: u for u in sharding.undivided(state, FakeMesh())}
  assert set(found) == {"['odd']", "['big']"}
  odd = found["['odd']"]
  assert (odd.shape, odd.name, odd.axis, odd.axis_size) == ((63, 6), "embed", "fsdp", 2)
  # Held per chip: 63 x 6 float32 split over tensor=2 only (756 B); over fsdp too it would be half of that.
  assert odd.extra_bytes == 63 * 6 * 4 // 2 - 63 * 6 * 4 // 4
  assert found["['big']"].extra_bytes == 2001 * 1024 * 4 // 2 // 2
  with caplog.at_level("INFO"):
    sharding.warn_undivided("ar", state, FakeMesh())
  (record,) = caplog.records
  assert record.levelname == "WARNING" and record.getMessage() == (
      "ar: 2 parameter(s) have a dimension that does not divide its mesh axis and are replicated over it, 1.95 MiB "
      "more per chip: ['big'] [2001, 1024]: embed over fsdp=2; ['odd'] [63, 6]: embed over fsdp=2")
  caplog.clear()
  with caplog.at_level("INFO"):  # under WARN_UNDIVIDED_BYTES: an info line
    sharding.warn_undivided("vae", _params(conv=((3, 3, 8, 3), (None, None, "conv_in", "conv_out"))), FakeMesh())
  (record,) = caplog.records
  assert record.levelname == "INFO" and record.getMessage().startswith("vae: 1 parameter(s) have a dimension")
