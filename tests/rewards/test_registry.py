import glmrl  # noqa: F401
import numpy as np
import pytest

from glmrl import rewards


def test_builtins_registered_with_their_kind():
  kinds = {name: rewards.get(name).pure_jax for name in rewards.names()}
  assert kinds == {"brightness": True, "colorfulness": True, "saturation": True, "target_neg_mse": True,
                   "target_psnr": True, "jpeg_compressibility": False, "clip_score": True, "pickscore": True, "hps": True,
                   "image_reward": True, "laion_aesthetic": True, "lpips": True, "remote": False, "text_accuracy": False,
                   "ocr_word_accuracy": False, "ocr_ned": False, "geneval": False,
                   "vlm_judge": False}
  model_backed = {n for n in rewards.names() if rewards.get(n).model_backed}
  assert model_backed == {"clip_score", "pickscore", "hps", "image_reward", "laion_aesthetic", "lpips", "remote", "text_accuracy",
                          "ocr_word_accuracy", "ocr_ned", "geneval", "vlm_judge"}


def test_register_get_unregister():
  def const(images, prompts, metadata, value=2.0):
    return np.full(len(prompts), value, np.float32)

  assert rewards.register("test_const", const, pure_jax=False) is const
  try:
    r = rewards.get("test_const")
    assert r.name == "test_const" and r.fn is const and not r.pure_jax
    np.testing.assert_array_equal(r(None, ["a", "b"], {}, value=3.0), [3.0, 3.0])
    with pytest.raises(ValueError, match="'test_const' is already registered"):
      rewards.register("test_const", const, pure_jax=True)
    rewards.register("test_const", const, pure_jax=True, replace=True)
    assert rewards.get("test_const").pure_jax
  finally:
    rewards.unregister("test_const")
  assert "test_const" not in rewards.names()


def test_unknown_name_lists_registered():
  with pytest.raises(ValueError, match=r"unknown reward 'nope'; registered rewards: \['brightness', "):
    rewards.get("nope")


@pytest.mark.parametrize("name,fn,pure_jax,match", [
    ("", len, True, "non-empty string"),
    ("x", 3, True, "not callable"),
    ("x", len, 1, "pure_jax=1 must be a bool"),
])
def test_register_errors(name, fn, pure_jax, match):
  with pytest.raises(ValueError, match=match):
    rewards.register(name, fn, pure_jax=pure_jax)
