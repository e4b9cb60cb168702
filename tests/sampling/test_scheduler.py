"""Scheduler parity with diffusers' FlowMatchEulerDiscreteScheduler as GlmImagePipeline drives it.

Timesteps and sigmas are compared with np.array_equal (both float32); the Euler steps too.
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)


import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.glm_image.pipeline_glm_image import calculate_shift, retrieve_timesteps

from glmrl.sampling import scheduler as S
from tests import shared_facts

CONFIG = shared_facts.read_json("scheduler_config.json")
CASES = [(50, 1024, 1024), (30, 768, 1152), (1, 512, 512), (7, 2048, 1024), (28, 1280, 736)]


def reference_schedule(n, height, width, config=CONFIG, timesteps=None, sigmas=None):
  """The schedule block of GlmImagePipeline.__call__ (inlined there, so restated here), with the
  pipeline module's own calculate_shift / retrieve_timesteps and a real scheduler."""
  sched = FlowMatchEulerDiscreteScheduler.from_config(config)
  vae_scale_factor, patch_size = 8, 2
  seq = ((height // vae_scale_factor) * (width // vae_scale_factor)) // (patch_size ** 2)
  ts = (np.linspace(sched.config.num_train_timesteps, 1.0, n + 1)[:-1] if timesteps is None
        else np.array(timesteps))
  ts = ts.astype(np.int64).astype(np.float32)
  sg = ts / sched.config.num_train_timesteps if sigmas is None else sigmas
  mu = calculate_shift(seq, sched.config.get("base_image_seq_len", 256),
                       sched.config.get("base_shift", 0.25), sched.config.get("max_shift", 0.75))
  ts, _ = retrieve_timesteps(sched, n, "cpu", ts, sg, mu=mu)
  return sched, ts, mu


@pytest.mark.parametrize("n,height,width", CASES)
def test_schedule_exactly_equal(n, height, width):
  sched, ts, mu = reference_schedule(n, height, width)
  ours = S.glm_image_schedule(n, height, width, S.SchedulerConfig.from_hf(CONFIG))
  assert ours.timesteps.dtype == np.float32 and ours.sigmas.dtype == np.float32
  assert np.array_equal(ours.timesteps, ts.numpy())
  assert np.array_equal(ours.sigmas, sched.sigmas.numpy())
  assert ours.mu == mu
  # The pipeline feeds the DiT `t.expand(B) - 1`.
  assert np.array_equal(ours.model_timesteps, np.stack([(t.expand(1) - 1).numpy()[0] for t in ts]))


def test_custom_timesteps_and_sigmas():
  timesteps = [1000, 900.7, 500, 10]
  sigmas = [0.99, 0.8, 0.45, 0.02]
  for kw in (dict(timesteps=timesteps), dict(timesteps=timesteps, sigmas=sigmas)):
    sched, ts, _ = reference_schedule(len(timesteps), 1024, 768, **kw)
    ours = S.glm_image_schedule(len(timesteps), 1024, 768, **kw)
    assert np.array_equal(ours.timesteps, ts.numpy())
    assert np.array_equal(ours.sigmas, sched.sigmas.numpy())


@pytest.mark.parametrize("overrides", [dict(time_shift_type="exponential"),
                                       dict(use_dynamic_shifting=False, shift=3.0)])
def test_other_shift_modes(overrides):
  config = {**CONFIG, **overrides}
  sched, ts, _ = reference_schedule(20, 1024, 1024, config=config)
  ours = S.glm_image_schedule(20, 1024, 1024, S.SchedulerConfig.from_hf(config))
  assert np.array_equal(ours.timesteps, ts.numpy())
  assert np.array_equal(ours.sigmas, sched.sigmas.numpy())


def test_euler_steps():
  """Eager steps are bit-identical to the reference. Under jit XLA may fuse `x + dt * v` into one
  fused multiply-add (one rounding instead of two), so the jitted step is checked from the same
  input to 1e-6 (values are O(1); a rounding difference is ~1e-7)."""
  n = 12
  sched, ts, _ = reference_schedule(n, 512, 768)
  ours = S.glm_image_schedule(n, 512, 768)
  jitted = jax.jit(S.euler_step_at)
  rng = np.random.default_rng(0)
  x_ref = torch.from_numpy(rng.standard_normal((2, 16, 8, 12), dtype=np.float32))
  for i, t in enumerate(ts):
    v = rng.standard_normal((2, 16, 8, 12), dtype=np.float32)
    x_in = jnp.asarray(x_ref.numpy())
    x_ref = sched.step(torch.from_numpy(v), t, x_ref, return_dict=False)[0]
    eager = S.euler_step(x_in, jnp.asarray(v), ours.sigmas[i], ours.sigmas[i + 1])
    assert eager.dtype == jnp.float32
    assert np.array_equal(np.asarray(eager), x_ref.numpy()), f"step {i}"
    np.testing.assert_allclose(np.asarray(jitted(ours.sigmas, i, x_in, jnp.asarray(v))), x_ref.numpy(),
                               rtol=0, atol=1e-6)


def test_config_round_trip_and_errors():
  cfg = S.SchedulerConfig.from_hf(CONFIG)
  assert cfg == S.SchedulerConfig.full()
  assert S.SchedulerConfig.from_hf(cfg.to_hf()) == cfg
  assert dict(FlowMatchEulerDiscreteScheduler.from_config(cfg.to_hf()).config).items() >= \
      {k: v for k, v in CONFIG.items() if not k.startswith("_")}.items()
  with pytest.raises(ValueError, match="use_karras_sigmas"):
    S.SchedulerConfig.from_hf({**CONFIG, "use_karras_sigmas": True})
  with pytest.raises(ValueError, match="time_shift_type"):
    S.SchedulerConfig(time_shift_type="cubic")
  with pytest.raises(ValueError, match="num_inference_steps"):
    S.glm_image_schedule(0, 512, 512)
  with pytest.raises(ValueError, match="height"):
    S.glm_image_schedule(10, -512, 512)
  with pytest.raises(ValueError, match="sigmas"):
    S.glm_image_schedule(3, 512, 512, timesteps=[900, 500, 100], sigmas=[0.9, 0.5])
