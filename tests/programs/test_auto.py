"""`auto` settings (glmrl/programs/auto.py): the DiT's attention kernel by platform, and the AR sampler's weight layout
by the run's per-chip sizes on the slice's chips, as --mode=compile and every run resolve them."""

import os

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import glmrl  # noqa: F401,E402

import importlib  # noqa: E402

import pytest  # noqa: E402

from glmrl.programs import auto  # noqa: E402
from glmrl.programs import compile_mode as mode_lib  # noqa: E402
from glmrl.programs import abstract  # noqa: E402
from glmrl.programs import topology  # noqa: E402
from glmrl.errors import UserError  # noqa: E402
from tests.train.common import tiny_config  # noqa: E402


def _build(config, slice_name: str, hbm_bytes=None):
  mesh = mode_lib._mesh(config, topology.devices(topology.parse(slice_name)))  # pylint: disable=protected-access
  return abstract.build(config, mesh, hbm_bytes=hbm_bytes)


@pytest.mark.parametrize("platform,dtype,kernel", [("cpu", "float32", "xla"), ("cpu", "bfloat16", "xla"),
                                                    ("tpu", "float32", "splash"), ("gpu", "bfloat16", "cudnn"),
                                                    ("gpu", "float32", "xla")])
def test_dit_attention_is_the_platforms_flash_kernel(platform, dtype, kernel):
  config = tiny_config(model__compute_dtype=dtype)
  assert config.model.dit_attention == "auto"  # the default
  assert auto.dit_attention(config, platform).value == kernel
  config.model.dit_attention = "blocked"
  assert auto.dit_attention(config, platform) is None  # an explicit kernel is kept


def test_the_sampler_reads_the_gathered_generator_where_it_fits_and_the_update_layout_where_not():
  config = tiny_config(data__prompts_per_step=4)  # 16 rows over 8 chips
  assert config.rollout.ar_weights == "auto"  # the default
  run = _build(config, "v5e-8")
  assert run.config.rollout.ar_weights == "gathered" and run.config.model.dit_attention == "splash"
  assert all(policy.config is run.config for policy in run.policies.values())  # bound once, to the choices
  assert config.rollout.ar_weights == "auto"  # the user's config is not changed
  choice = {c.key: c for c in run.choices}["rollout.ar_weights"]
  assert "within 90% of 14.9 GiB" in choice.why and choice.line().startswith("config.rollout.ar_weights=auto -> ")
  # The same run on chips of 1 MiB: the copy does not fit beside the resident state.
  small = _build(config, "v5e-8", hbm_bytes=2 ** 20)
  assert small.config.rollout.ar_weights == "update" and "over 90% of 0.0 GiB" in small.choices[-1].why
  with pytest.raises(UserError, match=r"the run's resident state takes 0\.\d\d GiB per device, more than a "
                                      r"device's 0\.00 GiB"):
    auto.check_resident_fits(small, 2 ** 10)
  # No fsdp split: the two layouts are one.
  unsplit = _build(tiny_config(data__prompts_per_step=4, mesh__data=8, mesh__fsdp=1), "v5e-8")
  assert unsplit.config.rollout.ar_weights == "update" and "mesh.fsdp=1" in unsplit.choices[-1].why
  # An explicit layout is kept.
  explicit = _build(tiny_config(data__prompts_per_step=4, rollout__ar_weights="update"), "v5e-8")
  assert explicit.config.rollout.ar_weights == "update" and [c.key for c in explicit.choices] == [
      "model.dit_attention"]


def test_released_t2i_on_v5p_64_samples_the_gathered_generator():
  """The released recipe at its size (abstract shapes): 3.8 GiB of resident state, the 18.8 GiB bfloat16 copy and
  the KV cache fit a v5p chip's 95 GB; its compile report's sampler goes from link-bound to HBM-bound with it."""
  config = importlib.import_module("configs.glm_image_t2i").get_config()
  run = _build(config, "v5p-64")
  assert run.config.rollout.ar_weights == "gathered" and run.config.model.dit_attention == "splash"
  assert all(policy.config is run.config for policy in run.policies.values())  # bound once, to the choices
  assert "generator copy 18.84 GiB" in run.choices[-1].why
