"""The registry's model-backed rewards (what the CLIP rewards use), with a fake "model"."""

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from glmrl import rewards
from glmrl.rewards import ModelReward, RewardComposer

BUILDS = []


def _offset_factory(offset: float, key: str = "fake/prompt_len"):
  """Loads its "weights" once; scores offset + first pixel + the prepared prompt length."""
  BUILDS.append(offset)
  weights = jnp.asarray(offset, jnp.float32)

  def prepare(prompts, metadata):
    return {key: np.asarray([len(p) for p in prompts], np.float32)}

  def fn(images, prompts, metadata):
    return weights + jnp.asarray(images)[:, 0, 0, 0].astype(jnp.float32) + metadata[key]

  return ModelReward(fn, prepare)


def _plain_factory(scale: float):
  BUILDS.append(scale)
  return lambda images, prompts, metadata: scale * jnp.ones((images.shape[0],), jnp.float32)


@pytest.fixture(scope="module", autouse=True)
def fake_rewards():
  rewards.register_factory("test_offset", _offset_factory, pure_jax=True)
  rewards.register_factory("test_plain", _plain_factory, pure_jax=True)
  yield
  rewards.unregister("test_offset")
  rewards.unregister("test_plain")


def test_factory_built_once_per_entry_and_prepare_feeds_jit():
  BUILDS.clear()
  composer = RewardComposer([{"name": "test_offset", "weight": 2.0, "kwargs": {"offset": 1.5}},
                             {"name": "test_plain", "weight": 1.0, "kwargs": {"scale": 3.0}},
                             {"name": "brightness", "weight": 0.0}])
  assert BUILDS == [1.5, 3.0]
  images = np.zeros((3, 4, 4, 3), np.uint8)
  images[:, 0, 0, 0] = [1, 2, 3]
  prompts = ["a", "bb", "ccc"]
  total, comps = composer(images, prompts)
  np.testing.assert_allclose(comps["test_offset"], [3.5, 5.5, 7.5])
  np.testing.assert_allclose(total, 2 * comps["test_offset"] + 3.0)
  prepared = composer.prepare(prompts, {})
  assert list(prepared) == ["fake/prompt_len"]
  fused = jax.jit(lambda x, m: composer.combine(composer.jax_scores(x, m)))
  np.testing.assert_allclose(np.asarray(fused(images, prepared)), total)
  assert BUILDS == [1.5, 3.0]


def test_errors():
  with pytest.raises(ValueError, match=r"reward 'test_offset' takes no argument 'nope'; it takes \['offset', 'key'\]"):
    RewardComposer([{"name": "test_offset", "weight": 1.0, "kwargs": {"offset": 1.0, "nope": 2}}])
  with pytest.raises(ValueError, match=r"reward 'test_offset' needs 'offset' \(it takes \['offset', 'key'\]\)"):
    RewardComposer([{"name": "test_offset", "weight": 1.0}])
  composer = RewardComposer([{"name": "test_offset", "weight": 1.0, "kwargs": {"offset": 0.0}}])
  with pytest.raises(ValueError, match=r"prepare's key\(s\) \['fake/prompt_len'\] are already in the metadata"):
    composer(np.zeros((1, 4, 4, 3), np.uint8), ["a"], {"fake/prompt_len": np.zeros(1)})
  rewards.register_factory("test_bad_prepare", lambda: ModelReward(
      lambda images, prompts, metadata: jnp.zeros(images.shape[0]),
      lambda prompts, metadata: {"bad": np.zeros(2)}), pure_jax=True)
  try:
    with pytest.raises(ValueError, match=r"prepare gave 'bad' of shape \(2,\) for 1 prompts"):
      RewardComposer([{"name": "test_bad_prepare", "weight": 1.0}]).prepare(["a"], {})
  finally:
    rewards.unregister("test_bad_prepare")
  with pytest.raises(ValueError, match="is model-backed"):
    rewards.get("test_offset")(None, None, None)
  rewards.register_factory("test_broken", lambda: 3, pure_jax=True)
  try:
    with pytest.raises(ValueError, match="factory returned 3"):
      RewardComposer([{"name": "test_broken", "weight": 1.0}])
  finally:
    rewards.unregister("test_broken")
  with pytest.raises(ValueError, match="is not callable"):
    ModelReward(fn=lambda *a: 0, prepare="x")

