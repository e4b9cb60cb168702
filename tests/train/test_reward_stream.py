"""Host and served rewards scored a decoder call at a time while the next call runs (glmrl.train.reward_stream):
the same scores, errors and training as scoring after the whole decode, bit for bit.

As users run it: the demo (16 images in decoder calls of 1) and the decoupled `:tiny` recipe, each with a host
reward, through main.py with `rollout.overlap_rewards` on and off: the same metrics and the same trained arrays in
the checkpoint, exactly (their time/ scalars aside); the decoupled recipe also as 2 processes x 4 devices, and the
demo's pod test (tests/train/test_multihost.py) as well."""

import json
import threading

import numpy as np
import jax
import pytest

from glmrl import rewards
from glmrl.rewards.remote import RemoteRewardError
from glmrl.train import reward_stream
from tests.cli import main_in_process
from tests.rewards.test_remote import FAST, serving
from tests.train.processes import assert_same_training, launch

JPEG = "{'name': 'jpeg_compressibility', 'weight': 1e-4}"


def _images(b=8):
  rng = np.random.default_rng(0)
  return rng.integers(0, 256, (b, 16, 16, 3), np.uint8)


@pytest.fixture
def recorded():
  """A host reward that records the rows it was given (each image's first pixel) and the thread it ran on."""
  calls = []

  def fn(images, prompts, metadata):
    calls.append((images[:, 0, 0, 0].tolist(), list(prompts), list(metadata["tag"]), threading.current_thread().name))
    if "fail" in prompts:
      raise ValueError(f"cannot score {prompts.index('fail')} of these")
    return images.reshape(images.shape[0], -1).mean(axis=1) / 255.0 + np.asarray(metadata["tag"], np.float32)

  rewards.register("test_recorded", fn, pure_jax=False)
  yield calls
  rewards.unregister("test_recorded")


def _stream(composer, prompts, metadata, images, parts):
  stream = reward_stream.RewardStream({"p": composer}, prompts, {"p": composer.inputs(prompts, metadata)},
                                      images.shape[0])
  try:
    for first in range(0, images.shape[0], parts):
      stream.add(first, jax.numpy.asarray(images[first:first + parts]))
    return stream.result(jax.numpy.asarray(images))["p"], stream
  finally:
    stream.close()


def test_parts_score_as_the_whole_batch_in_order_on_one_worker(recorded):
  composer = rewards.RewardComposer([{"name": "test_recorded", "weight": 1.0}, {"name": "brightness", "weight": 2.0}],
                                    group_size=4)
  images, prompts = _images(), [f"p{i}" for i in range(8)]
  metadata = {"tag": np.arange(8, dtype=np.float32)}
  want = composer.host_components(images, prompts, metadata)
  assert len(recorded) == 1
  got, stream = _stream(composer, prompts, metadata, images, parts=2)
  assert got.keys() == want.keys() == {"test_recorded"}
  np.testing.assert_array_equal(got["test_recorded"], want["test_recorded"])
  parts = recorded[1:]
  assert [p[0] for p in parts] == [images[i:i + 2, 0, 0, 0].tolist() for i in range(0, 8, 2)]  # in order
  assert [p[1] for p in parts] == [prompts[i:i + 2] for i in range(0, 8, 2)]
  assert [p[2] for p in parts] == [[float(i), float(i + 1)] for i in range(0, 8, 2)]
  assert {p[3] for p in parts} == {parts[0][3]} and parts[0][3].startswith("reward-stream")
  assert stream.seconds()["p"]["test_recorded"] > 0
  total_serial, _ = composer.score(images, prompts, metadata)
  total, _ = composer.score_inputs(images, prompts, composer.inputs(prompts, metadata), got)
  np.testing.assert_array_equal(total, total_serial)


def test_a_failing_part_fails_with_the_serial_error_and_later_parts_are_not_scored(recorded):
  composer = rewards.RewardComposer([{"name": "test_recorded", "weight": 1.0}])
  images, prompts = _images(), ["ok"] * 3 + ["fail"] + ["ok"] * 4
  metadata = {"tag": np.zeros(8, np.float32)}
  with pytest.raises(ValueError) as serial:
    composer.host_components(images, prompts, metadata)
  recorded.clear()
  with pytest.raises(ValueError) as streamed:
    _stream(composer, prompts, metadata, images, parts=2)
  assert str(serial.value) == "cannot score 3 of these"
  assert str(streamed.value) == "cannot score 1 of these"  # the reward's own message, about the part it was given
  assert len(recorded) == 2  # parts 0 and 1; the two after the failure were never scored


def test_a_served_rewards_error_names_the_batchs_rows_either_way():
  """A server failing on one image: the remote reward's one line names the same images of the batch, whether it
  was sent the whole batch or the decoder's parts."""
  def scorer(images, prompts, metadata):
    if "broken" in prompts:
      raise RuntimeError("the judge fell over")
    return [0.5] * len(prompts)

  with serving(scorer) as server:
    url = f"http://127.0.0.1:{server.server_address[1]}/score"
    composer = rewards.RewardComposer([{"name": "remote", "weight": 1.0,
                                        "kwargs": {"url": url, "retries": 0, "chunk_size": 2, **FAST}}])
    images, prompts = _images(), ["fine"] * 5 + ["broken"] + ["fine"] * 2
    with pytest.raises(RemoteRewardError) as serial:
      composer.host_components(images, prompts, {})
    with pytest.raises(RemoteRewardError) as streamed:
      _stream(composer, prompts, {}, images, parts=2)
  assert str(serial.value).startswith(f"reward server {url} (images 4..5): failed after 1 attempt(s); last error: "
                                    "HTTP 500: ") and "the judge fell over" in str(serial.value), serial.value
  assert str(streamed.value) == str(serial.value)


@pytest.mark.parametrize("recipe,flags", [
    ("demo", ("--config=configs/demo.py", "--config.train.num_steps=2", "--config.checkpoint.save_interval=2",
              f"--config.rewards=({{'name': 'brightness', 'weight': 1.0}}, {JPEG})")),
    ("decoupled", ("--config=configs/glm_image_t2i_decoupled.py:tiny", "--config.train.num_steps=1",
                   "--config.log.image_interval=0", "--config.sampling.decode_batch=4",
                   f"--config.rewards=({{'name': 'brightness', 'weight': 1.0}}, {JPEG})",
                   f"--config.decoder.rewards=({{'name': 'saturation', 'weight': 1.0}}, {JPEG})")),
])
def test_training_overlapped_is_training_serial(tmp_path, recipe, flags):
  """main.py with the overlap on (the default) and off: the same run. Its host reward's seconds and the step's wait
  for rewards after the decode are logged."""
  runs = {}
  for overlap in (True, False):
    runs[overlap] = tmp_path / str(overlap)
    result = main_in_process(*flags, f"--config.rollout.overlap_rewards={overlap}", tmp_path=runs[overlap])
    assert result.returncode == 0, result.stderr[-3000:]
  step = 2 if recipe == "demo" else 1
  assert_same_training(runs[True], runs[False], step)
  last = json.loads((runs[True] / "metrics.jsonl").read_text().splitlines()[-1])
  prefixes = ("",) if recipe == "demo" else ("ar/", "decoder/")
  for prefix in prefixes:
    assert last[f"time/reward/{prefix}jpeg_compressibility"] > 0
  assert 0 <= last["time/reward_wait"] <= last["time/reward"]


def test_two_processes_train_the_decoupled_recipe_overlapped_as_serial(tmp_path):
  """The decoupled `:tiny` recipe as 2 processes x 4 devices, its 16 images in 2 decoder calls of 8 and a host reward
  on each policy (each process scores its own rows of each call): the same run with the overlap on and off."""
  flags = ("--config=configs/glm_image_t2i_decoupled.py:tiny", "--config.train.num_steps=1",
           "--config.checkpoint.save_interval=1", "--config.log.image_interval=0", "--config.sampling.decode_batch=8",
           f"--config.rewards=({{'name': 'brightness', 'weight': 1.0}}, {JPEG})",
           f"--config.decoder.rewards=({{'name': 'saturation', 'weight': 1.0}}, {JPEG})")
  for overlap in (True, False):
    launch(tmp_path / str(overlap), *flags, f"--config.rollout.overlap_rewards={overlap}")
  assert_same_training(tmp_path / "True", tmp_path / "False", 1)
