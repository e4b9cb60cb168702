import json

import glmrl  # noqa: F401
import numpy as np
import pytest
from PIL import Image

from glmrl.data import PromptIterator, PromptRecord, load_image, load_prompts


def _records(n):
  return [PromptRecord(prompt=f"p{i}", line=i + 1) for i in range(n)]


def _take(it, k):
  return [next(it) for _ in range(k)]


def test_epochs_are_seeded_permutations_chunked_into_fixed_batches():
  n, b, seed = 7, 3, 11
  it = PromptIterator(_records(n), prompts_per_step=b, seed=seed, height=32, width=32)
  stream = np.concatenate([np.random.default_rng((seed, e)).permutation(n) for e in range(4)])
  batches = _take(it, 9)
  assert all(len(x.prompts) == b and x.indices.shape == (b,) for x in batches)
  got = np.concatenate([x.indices for x in batches])
  np.testing.assert_array_equal(got, stream[:27])
  assert [x.prompts for x in batches[:1]] == [[f"p{i}" for i in stream[:3]]]
  # Every epoch covers every record exactly once, and epochs are shuffled differently.
  assert sorted(stream[:n]) == list(range(n)) and not np.array_equal(stream[:n], stream[n:2 * n])
  assert it.state() == {"epoch": 27 // n, "index": 27 % n, "seed": seed, "num_records": n}


def test_batch_larger_than_dataset_spans_epochs():
  it = PromptIterator(_records(2), prompts_per_step=5, seed=0, height=32, width=32)
  first = next(it)
  assert len(first.prompts) == 5
  assert it.state()["epoch"] == 2 and it.state()["index"] == 1


def test_resume_from_json_state_matches_uninterrupted_run():
  n, b = 10, 4
  full = PromptIterator(_records(n), prompts_per_step=b, seed=3, height=32, width=32)
  want = [x.indices.tolist() for x in _take(full, 12)]

  first = PromptIterator(_records(n), prompts_per_step=b, seed=3, height=32, width=32)
  got = [x.indices.tolist() for x in _take(first, 5)]
  saved = json.dumps(first.state())
  resumed = PromptIterator(_records(n), prompts_per_step=b, seed=3, height=32, width=32)
  resumed.restore(json.loads(saved))
  got += [x.indices.tolist() for x in _take(resumed, 7)]
  assert got == want


@pytest.mark.parametrize("state,match", [
    ({"epoch": 0, "index": 0, "seed": 4, "num_records": 5}, "seed=4 differs"),
    ({"epoch": 0, "index": 0, "seed": 3, "num_records": 6}, "num_records=6 differs"),
    ({"epoch": 0, "index": 5, "seed": 3, "num_records": 5}, "index=5 must be < num_records=5"),
    ({"epoch": -1, "index": 0, "seed": 3, "num_records": 5}, "epoch=-1 must be a non-negative"),
    ({"epoch": 0, "index": 0}, "must have exactly the keys"),
])
def test_restore_rejects_bad_state(state, match):
  it = PromptIterator(_records(5), prompts_per_step=2, seed=3, height=32, width=32)
  with pytest.raises(ValueError, match=match):
    it.restore(state)


@pytest.mark.parametrize("kwargs,match", [
    ({"prompts_per_step": 0}, "prompts_per_step=0"),
    ({"seed": -1}, "seed=-1"),
    ({"height": 48}, "height=48 must be a positive multiple of 32"),
    ({"width": 33}, "width=33 must be a positive multiple of 32"),
])
def test_constructor_errors(kwargs, match):
  args = {"prompts_per_step": 2, "seed": 0, "height": 32, "width": 32, **kwargs}
  with pytest.raises(ValueError, match=match):
    PromptIterator(_records(3), **args)


def test_batch_images_and_metadata(tmp_path):
  rng = np.random.default_rng(0)
  for name, size in (("t0.png", (64, 32)), ("t1.png", (50, 70)), ("s.png", (32, 64))):
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(tmp_path / name)
  rows = [
      {"prompt": "a", "target_image": "t0.png", "source_images": ["s.png", "t1.png"],
       "metadata": {"w": 1.5, "tag": "x", "only_a": 1}},
      {"prompt": "b", "target_image": "t1.png", "metadata": {"w": 2, "tag": "y"}},
  ]
  (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  recs = load_prompts(tmp_path / "p.jsonl")
  it = PromptIterator(recs, prompts_per_step=2, seed=0, height=64, width=32)
  batch = next(it)
  order = batch.indices.tolist()
  assert batch.prompts == [rows[i]["prompt"] for i in order]
  target = batch.metadata["target_image"]
  assert target.dtype == np.uint8 and target.shape == (2, 64, 32, 3)
  for b, i in enumerate(order):
    np.testing.assert_array_equal(target[b], load_image(recs[i].target_image, 64, 32))
  np.testing.assert_array_equal(batch.metadata["w"], np.array([[1.5, 2.0][i] for i in order]))
  assert batch.metadata["w"].dtype == np.float64
  assert batch.metadata["tag"] == [["x", "y"][i] for i in order]
  assert batch.metadata["only_a"] == [[1, None][i] for i in order]
  shapes = {i: batch.source_images[b].shape for b, i in enumerate(order)}
  assert shapes == {0: (2, 64, 32, 3), 1: (0, 64, 32, 3)}
  assert all(s.dtype == np.uint8 for s in batch.source_images)


def test_txt_batches_have_no_target():
  it = PromptIterator(_records(3), prompts_per_step=2, seed=0, height=32, width=32)
  assert next(it).metadata == {}
