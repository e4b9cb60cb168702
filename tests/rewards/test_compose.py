import glmrl  # noqa: F401
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from glmrl import rewards
from glmrl.rewards import RewardComposer, group_normalize
from tests.grpo import reference

TOL = dict(rtol=1e-5, atol=1e-6)
SEEN_PROMPTS = []


def _prompt_length(images, prompts, metadata, scale=1.0):
  """Host reward that reads the strings."""
  return np.asarray([scale * len(p) for p in prompts], np.float32)


def _first_pixel(images, prompts, metadata):
  """Pure-JAX reward that records what it was given as prompts."""
  SEEN_PROMPTS.append(prompts)
  return jnp.asarray(images)[:, 0, 0, 0].astype(jnp.float32)


def _wrong_shape(images, prompts, metadata):
  return np.zeros((len(prompts), 2), np.float32)


@pytest.fixture(scope="module", autouse=True)
def custom_rewards():
  rewards.register("test_prompt_length", _prompt_length, pure_jax=False)
  rewards.register("test_first_pixel", _first_pixel, pure_jax=True)
  rewards.register("test_wrong_shape", _wrong_shape, pure_jax=False)
  yield
  for name in ("test_prompt_length", "test_first_pixel", "test_wrong_shape"):
    rewards.unregister(name)


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
  target = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
  prompts = ["a", "bb", "ccc", "dddd", "ee", "f"]
  return images, prompts, {"target_image": target, "tags": ["x"] * 6}


def _ref_group_normalize(x, n):
  """Unbiased std, the convention of the group advantages (tests/grpo/reference.py)."""
  x = np.asarray(x, np.float64).reshape(-1, n)
  out = np.zeros_like(x)
  for g, row in enumerate(x):
    if not np.all(row == row[0]):
      out[g] = (row - row.mean()) / row.std(ddof=1)
  return out.reshape(-1)


def test_group_normalize_golden_and_constant_groups():
  x = np.array([1.0, 2.0, 3.0, 6.0, 0.1, 0.1, 0.1, 0.1, 1e6 + 0.1, 1e6 + 0.1, 1e6 + 0.1, 1e6 + 0.1], np.float32)
  got = np.asarray(group_normalize(x, 4))
  np.testing.assert_allclose(got, _ref_group_normalize(x, 4), **TOL)
  np.testing.assert_allclose(got[:4], np.array([-2, -1, 0, 3]) / np.sqrt(14 / 3), **TOL)
  # The same standardisation as the advantages: one std convention, and rounding noise is no signal.
  np.testing.assert_allclose(got, reference.advantages(x, 4), **TOL)
  noisy = np.array([0.5, 0.50000006, 0.49999997, 0.5], np.float32)
  assert np.all(np.asarray(group_normalize(noisy, 4)) == 0.0)
  assert np.any(np.asarray(group_normalize(noisy, 4, std_eps=0.0)) != 0.0)
  assert np.all(got[4:] == 0.0)
  jitted = jax.jit(lambda s: group_normalize(s, 4))(jnp.asarray(x))
  np.testing.assert_array_equal(jitted, got)
  with pytest.raises(ValueError, match="not a vector whose length is divisible by group_size=4"):
    group_normalize(np.zeros(6), 4)
  with pytest.raises(ValueError, match="group_size=0"):
    group_normalize(np.zeros(6), 0)


def test_weighted_total_and_raw_components(batch):
  images, prompts, metadata = batch
  composer = RewardComposer([
      {"name": "brightness", "weight": 2.0},
      {"name": "target_neg_mse", "weight": 0.5},
      {"name": "test_prompt_length", "weight": -1.0, "kwargs": {"scale": 0.25}},
      {"name": "jpeg_compressibility", "weight": 0.01, "kwargs": {"quality": 80}},
  ])
  total, comps = composer(images, prompts, metadata)
  assert list(comps) == ["brightness", "target_neg_mse", "test_prompt_length", "jpeg_compressibility"]
  for name, kwargs in (("brightness", {}), ("jpeg_compressibility", {"quality": 80})):
    np.testing.assert_allclose(comps[name], rewards.get(name)(images, prompts, metadata, **kwargs), **TOL)
  np.testing.assert_allclose(comps["test_prompt_length"], [0.25 * len(p) for p in prompts], **TOL)
  want = sum(w * comps[n].astype(np.float64) for n, w in
             (("brightness", 2.0), ("target_neg_mse", 0.5), ("test_prompt_length", -1.0),
              ("jpeg_compressibility", 0.01)))
  assert total.dtype == np.float32 and total.shape == (6,)
  assert all(isinstance(c, np.ndarray) and c.dtype == np.float32 for c in comps.values())
  np.testing.assert_allclose(total, want, **TOL)


def test_per_reward_group_normalisation(batch):
  images, prompts, metadata = batch
  composer = RewardComposer([
      {"name": "test_prompt_length", "weight": 1.0, "normalize": True},
      {"name": "brightness", "weight": 3.0},
  ], group_size=3)
  total, comps = composer(images, prompts, metadata)
  want = _ref_group_normalize(comps["test_prompt_length"], 3) + 3.0 * comps["brightness"].astype(np.float64)
  np.testing.assert_allclose(total, want, **TOL)
  # Constant groups contribute exactly zero.
  total, comps = RewardComposer([{"name": "test_prompt_length", "weight": 5.0, "normalize": True}],
                                group_size=3)(images, ["same"] * 3 + ["x", "yy", "zzz"], metadata)
  assert np.all(total[:3] == 0.0)
  np.testing.assert_allclose(total[3:], 5.0 * _ref_group_normalize([1, 2, 3], 3), **TOL)


def test_pure_jax_rewards_run_under_jit_with_prompts_none(batch):
  images, prompts, metadata = batch
  SEEN_PROMPTS.clear()
  composer = RewardComposer([{"name": "test_first_pixel", "weight": 1.0}])
  total, _ = composer(jnp.asarray(images), prompts, metadata)
  np.testing.assert_array_equal(total, images[:, 0, 0, 0].astype(np.float32))
  assert SEEN_PROMPTS and all(p is None for p in SEEN_PROMPTS)
  # jax_scores can be fused into a caller's jit; non-array metadata stays outside.
  fused = jax.jit(lambda x, t: composer.combine(composer.jax_scores(x, {"target_image": t})))
  np.testing.assert_array_equal(fused(images, metadata["target_image"]), total)


def test_config_dict_entries_are_accepted(batch):
  images, prompts, metadata = batch
  cfg = [ml_collections.ConfigDict({"name": "target_psnr", "weight": 1.0, "kwargs": {"max_db": 30.0}})]
  total, comps = RewardComposer(cfg)(images, prompts, metadata)
  np.testing.assert_allclose(total, rewards.get("target_psnr")(images, None, metadata, max_db=30.0), **TOL)


@pytest.mark.parametrize("config,group_size,match", [
    ([{"name": "nope", "weight": 1.0}], None, r"unknown reward 'nope'; registered rewards: \['brightness'"),
    ([{"name": "brightness"}], None, "needs both 'name' and 'weight'"),
    ([{"name": "brightness", "weight": 1.0, "quality": 3}], None, r"unknown key\(s\) \['quality'\]"),
    ([{"name": "brightness", "weight": float("nan")}], None, "weight=nan must be a finite number"),
    ([{"name": "brightness", "weight": 1.0, "normalize": 1}], None, "normalize=1 must be a bool"),
    ([{"name": "brightness", "weight": 1.0, "normalize": True}], None, "normalize=True, which needs group_size"),
    ([{"name": "jpeg_compressibility", "weight": 1.0, "kwargs": {"qualty": 5}}], None,
     "'jpeg_compressibility' takes no argument 'qualty'; it takes \\['quality'\\]"),
    ([{"name": "brightness", "weight": 1.0}, {"name": "brightness", "weight": 2.0}], None,
     r"lists \['brightness'\] more than once"),
    ([], None, "must be a non-empty list"),
    ([{"name": "brightness", "weight": 1.0}], 0, "group_size=0"),
])
def test_config_errors(config, group_size, match):
  with pytest.raises(ValueError, match=match):
    RewardComposer(config, group_size=group_size)


def test_call_errors(batch):
  images, prompts, metadata = batch
  composer = RewardComposer([{"name": "brightness", "weight": 1.0}], group_size=4)
  with pytest.raises(ValueError, match="batch of 6 images is not divisible by group_size=4"):
    composer(images, prompts, metadata)
  composer = RewardComposer([{"name": "test_wrong_shape", "weight": 1.0}])
  with pytest.raises(ValueError, match="got 5 prompts for 6 images"):
    composer(images, prompts[:5], metadata)
  with pytest.raises(ValueError, match=r"'test_wrong_shape' returned shape \(6, 2\), expected \(6,\)"):
    composer(images, prompts, metadata)
  with pytest.raises(ValueError, match="images must be uint8"):
    composer(images.astype(np.float32), prompts, metadata)


def test_composer_normalises_with_the_runs_std_eps():
  """The run's grpo.std_eps reaches evaluation's composer too: a near-constant group is constant or not by it."""
  components = {"brightness": jnp.asarray([1.0, 1.0 + 1e-4, 2.0, 3.0], jnp.float32)}
  entries = [{"name": "brightness", "weight": 1.0, "normalize": True}]
  loose = np.asarray(RewardComposer(entries, group_size=2, std_eps=1e-3).combine(components))
  tight = np.asarray(RewardComposer(entries, group_size=2, std_eps=1e-6).combine(components))
  np.testing.assert_array_equal(loose[:2], [0.0, 0.0])
  np.testing.assert_allclose(tight[:2], [-2 ** -0.5, 2 ** -0.5], rtol=1e-2)
  np.testing.assert_allclose(loose[2:], tight[2:])
