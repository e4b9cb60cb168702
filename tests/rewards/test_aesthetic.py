"""LAION aesthetic predictor: the published MLP's weights file layout converted once, a golden test
against a torch re-implementation of the published MLP (random weights in that layout, tolerance
1e-5 on the score), and the `laion_aesthetic` reward end to end on a tiny CLIP against transformers
(1e-4; the images need no resize, so preprocessing is exact)."""

import glmrl  # noqa: F401

import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from checkpoints_convert.maps.clip import AESTHETIC_RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from checkpoints_convert import aesthetic as aesthetic_convert
from glmrl.models.clip import aesthetic as head_lib
from glmrl.rewards import RewardComposer
from glmrl.rewards import aesthetic as aesthetic_lib
from tests.cli import ROOT, TIMEOUT_S, without_torch
from tests.models.clip import tiny


class PublishedMLP(torch.nn.Module):
  """improved-aesthetic-predictor's MLP as released: its ReLUs are commented out."""

  def __init__(self, input_size=768, hidden=(1024, 128, 64, 16)):
    super().__init__()
    self.layers = torch.nn.Sequential(
        torch.nn.Linear(input_size, hidden[0]), torch.nn.Dropout(0.2),
        torch.nn.Linear(hidden[0], hidden[1]), torch.nn.Dropout(0.2),
        torch.nn.Linear(hidden[1], hidden[2]), torch.nn.Dropout(0.1),
        torch.nn.Linear(hidden[2], hidden[3]),
        torch.nn.Linear(hidden[3], 1))

  def forward(self, x):
    return self.layers(x)


def published(seed=0, **kwargs) -> PublishedMLP:
  torch.manual_seed(seed)
  return PublishedMLP(**kwargs).eval()


@pytest.fixture(scope="module")
def full_head(tmp_path_factory):
  mlp = published()
  path = tmp_path_factory.mktemp("head") / "sac+logos+ava1-l14-linearMSE.pth"
  torch.save(mlp.state_dict(), path)
  out = path.parent / "converted"
  aesthetic_convert.convert_aesthetic_head(str(path), str(out))
  return mlp, out


def test_rules_cover_the_published_layout(full_head):
  mlp, out = full_head
  keys = set(mlp.state_dict())
  assert keys == {f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias")}
  km = KeyMap(AESTHETIC_RULES)
  head = head_lib.load_head(str(out))
  paths = {flax_path_str(p) for p, _ in nnx.to_flat_state(nnx.state(head, nnx.Param))}
  assert {km.hf_to_flax(k)[0] for k in keys} == paths
  assert {km.flax_to_hf(p)[0] for p in paths} == keys


def test_golden_against_published_mlp(full_head):
  mlp, out = full_head
  head = head_lib.load_head(str(out))
  assert head.cfg == head_lib.AestheticConfig.full()
  x = np.random.default_rng(0).standard_normal((5, 768)).astype(np.float32)
  x /= np.linalg.norm(x, axis=-1, keepdims=True)
  with torch.no_grad():
    want = mlp(torch.from_numpy(x))[:, 0].numpy()
  got = nnx.jit(lambda h, e: h(e))(head, jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-5)


def test_converter_errors(tmp_path):
  sd = published(hidden=(24, 12, 8, 4), input_size=16).state_dict()
  bad = dict(sd)
  del bad["layers.4.bias"]
  bad["layers.9.weight"] = torch.zeros(1, 4)
  torch.save(bad, tmp_path / "bad.pth")
  with pytest.raises(ValueError, match=r"(?s)missing \(1\): layers.4.bias.*unexpected \(1\): layers.9.weight"):
    aesthetic_convert.convert_aesthetic_head(str(tmp_path / "bad.pth"), str(tmp_path / "o1"))
  torch.save({"layers.0.weight": torch.zeros(3, 3)}, tmp_path / "partial.pth")
  with pytest.raises(ValueError, match="missing"):
    aesthetic_convert.convert_aesthetic_head(str(tmp_path / "partial.pth"), str(tmp_path / "o2"))
  torch.save([1, 2], tmp_path / "list.pth")
  with pytest.raises(ValueError, match="not a state_dict"):
    aesthetic_convert.convert_aesthetic_head(str(tmp_path / "list.pth"), str(tmp_path / "o3"))
  assert aesthetic_convert.main(["--pth", str(tmp_path / "none.pth"), "--out_dir", str(tmp_path / "o4")]) == 2
  with pytest.raises(FileNotFoundError, match="has no config.json"):
    head_lib.load_head(str(tmp_path))


def test_reward_matches_transformers_pipeline(tmp_path):
  folder, ref = tiny.converted("legacy")
  mlp = published(seed=1, input_size=16, hidden=(24, 12, 8, 4))
  torch.save(mlp.state_dict(), tmp_path / "head.pth")
  # Converted as users without torch convert it (its CLI in a process where torch cannot be imported).
  done = subprocess.run(without_torch("checkpoints_convert.aesthetic", "--pth", str(tmp_path / "head.pth"),
                                      "--out_dir", str(tmp_path / "head")), cwd=ROOT, capture_output=True, text=True,
                        timeout=TIMEOUT_S)
  assert done.returncode == 0, done.stderr[-3000:]
  composer = RewardComposer([{"name": "laion_aesthetic", "weight": 1.0,
                              "kwargs": {"clip_dir": str(folder), "head_dir": str(tmp_path / "head")}}])
  images = tiny.random_images((3, 45, 32), seed=5)
  got = np.asarray(jax.jit(composer.jax_scores)(images, {})["laion_aesthetic"])
  (img,) = tiny.reference_embeddings(ref, images)
  with torch.no_grad():
    want = mlp(torch.from_numpy(img))[:, 0].numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
  wrong = tmp_path / "wrong"
  torch.save(published(input_size=8, hidden=(24, 12, 8, 4)).state_dict(), tmp_path / "w.pth")
  aesthetic_convert.convert_aesthetic_head(str(tmp_path / "w.pth"), str(wrong))
  with pytest.raises(ValueError, match="head reads 8-d embeddings, the CLIP gives 16-d"):
    aesthetic_lib.aesthetic_factory(str(folder), str(wrong))
