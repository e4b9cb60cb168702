"""The reward-hacking monitors: image statistics against numpy on hand-made images, and the warning when the
training reward rises while the held-out reward falls."""

import numpy as np

from glmrl.evaluation import monitors


def test_image_statistics_of_hand_made_images():
  flat_grey = np.full((8, 8, 3), 128, np.uint8)
  flat_red = np.zeros((8, 8, 3), np.uint8)
  flat_red[..., 0] = 255
  noise = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
  # Two prompts of two samples: (grey, grey) collapsed onto one image, (red, noise) distinct.
  images = np.stack([flat_grey, flat_grey, flat_red, noise])
  got = {k: float(v) for k, v in monitors.image_monitors(images, group_size=2).items()}
  x = images.reshape(4, -1).astype(np.float64) / 255
  rms = lambda a, b: np.sqrt(np.mean((a - b) ** 2))
  np.testing.assert_allclose(got["monitor/pairwise_distance"], (0.0 + rms(x[2], x[3])) / 2, atol=1e-5)
  assert got["monitor/near_constant_frac"] == 0.75  # grey, grey, red are flat; the noise is not
  hsv_s = lambda im: np.mean(np.where(im.max(-1) > 0, (im.max(-1) - im.min(-1)) / np.maximum(im.max(-1), 1), 0))
  np.testing.assert_allclose(got["monitor/saturation"], np.mean([hsv_s(i.astype(np.float64)) for i in images]),
                             atol=1e-6)
  assert monitors.jpeg_kb(images[:2]) < monitors.jpeg_kb(images[3:])  # noise compresses worst


def test_warning_after_patience_evaluations_of_diverging_rewards():
  watch = monitors.HackingWatch(["", "decoder/"], patience=2)
  held_out = [0.50, 0.48, 0.46, 0.47]
  warnings_at = []
  for k, eval_reward in enumerate(held_out):
    for step in range(3):  # the training reward keeps rising
      watch.step({"reward/mean": 0.1 * k + 0.01 * step, "decoder/reward/mean": 0.5})
    metrics, warnings = watch.evaluated(k, {"eval/reward/mean": eval_reward, "eval/decoder/reward/mean": 0.5})
    warnings_at += [k] * len(warnings)
    assert metrics["monitor/decoder/hacking_run"] == 0.0  # flat training reward: nothing to flag
  # Evaluations 1 and 2 diverge (2 in a row: one warning at 2); at 3 the held-out reward rises again.
  assert warnings_at == [2]
  assert metrics["monitor/hacking_run"] == 0.0
  assert monitors.eval_reward_key("ar/") == "eval/reward/mean"
  assert monitors.eval_reward_key("decoder/") == "eval/decoder/reward/mean"
