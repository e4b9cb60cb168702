"""LPIPS-VGG16: parity with a torch re-implementation of the `lpips` package's forward, key coverage,
converter round trip and the reward.

The `lpips` package itself cannot be the oracle here: it imports torchvision, which has no CPU build
in this environment. `TorchLPIPS` below re-states its v0.1 forward (ScalingLayer, VGG16 slices cut
at relu1_2 ... relu5_3, `normalize_tensor` with eps 1e-10, squared difference, 1x1 `NetLinLayer`
heads, spatial average, sum over layers) with the published state_dict layouts:
torchvision `features.{0,2,5,...}` and `lin{l}.model.1.weight`. Weights are random (VGG16 ImageNet
weights cannot be downloaded); the heads are made non-negative like the published ones.
Tolerance: 1e-4 max abs on the distances (float32).
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
from flax import nnx
from torch import nn

from checkpoints_convert import lpips as lpips_convert
from checkpoints_convert.maps.lpips import RULES
from checkpoints_convert.rules import KeyMap
from glmrl import rewards
from glmrl.models.vgg import CONVS_PER_BLOCK, VGG16Config, VGG16Features
from glmrl.models import lpips as lpips_model
from glmrl.rewards import lpips as lpips_lib
from tests.torch_port import abstract, port

ATOL = 1e-4


class TorchLPIPS(nn.Module):
  """The published LPIPS(net='vgg', version='0.1') forward on [-1, 1] NCHW inputs."""

  def __init__(self, cfg: VGG16Config):
    super().__init__()
    layers, cin = [], cfg.in_channels
    for block, (n, c) in enumerate(zip(CONVS_PER_BLOCK, cfg.block_channels)):
      if block:
        layers.append(nn.MaxPool2d(2, 2))
      for _ in range(n):
        layers += [nn.Conv2d(cin, c, 3, padding=1), nn.ReLU()]
        cin = c
    self.features = nn.Sequential(*layers)  # torchvision indices 0..29
    # Slice ends (exclusive) of lpips.pretrained_networks.vgg16: 4, 9, 16, 23, 30.
    self.cuts = (4, 9, 16, 23, 30)
    for i, c in enumerate(cfg.block_channels):
      lin = nn.Module()
      lin.model = nn.Sequential(nn.Dropout(), nn.Conv2d(c, 1, 1, bias=False))
      self.add_module(f"lin{i}", lin)
    self.register_buffer("shift", torch.tensor([-.030, -.088, -.188])[None, :, None, None], persistent=False)
    self.register_buffer("scale", torch.tensor([.458, .448, .450])[None, :, None, None], persistent=False)

  def taps(self, x):
    out, start = [], 0
    for end in self.cuts:
      for layer in self.features[start:end]:
        x = layer(x)
      out.append(x)
      start = end
    return out

  def forward(self, in0, in1):
    f0s, f1s = self.taps((in0 - self.shift) / self.scale), self.taps((in1 - self.shift) / self.scale)
    val = 0
    for i, (f0, f1) in enumerate(zip(f0s, f1s)):
      n0 = f0 / (torch.sqrt(torch.sum(f0 ** 2, dim=1, keepdim=True)) + 1e-10)
      n1 = f1 / (torch.sqrt(torch.sum(f1 ** 2, dim=1, keepdim=True)) + 1e-10)
      val = val + getattr(self, f"lin{i}").model((n0 - n1) ** 2).mean([2, 3], keepdim=True)
    return val


@pytest.fixture(scope="module")
def setup():
  cfg = lpips_model.LPIPSConfig.tiny()
  torch.manual_seed(0)
  ref = TorchLPIPS(cfg.vgg).eval()
  with torch.no_grad():
    for i in range(len(cfg.vgg.block_channels)):  # published heads are clamped to >= 0
      w = getattr(ref, f"lin{i}").model[1].weight
      w.copy_(w.abs())
  ours = port(ref, lpips_model.LPIPS, cfg, RULES)
  graphdef, state = nnx.split(ours)
  # One jitted program for uint8 pairs (the reward's path) and one for [-1, 1] float pairs.
  fn = jax.jit(lambda s, x, y: lpips_lib.lpips_distance(nnx.merge(graphdef, s), x, y))
  float_fn = jax.jit(lambda s, x, y: nnx.merge(graphdef, s)(x, y))
  return cfg, ref, ours, lambda x, y: fn(state, x, y), lambda x, y: float_fn(state, x, y)


def _torch_lpips(ref, images, target):
  def prep(a):
    return torch.from_numpy(a.astype(np.float32) / 127.5 - 1.0).permute(0, 3, 1, 2)
  with torch.no_grad():
    return ref(prep(images), prep(target)).reshape(-1).numpy()


def _pair(seed, shape=(3, 40, 48, 3)):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, shape, dtype=np.uint8)
  target = np.clip(images.astype(int) + rng.integers(-60, 61, shape), 0, 255).astype(np.uint8)
  target[1] = rng.integers(0, 256, shape[1:], dtype=np.uint8)  # an unrelated pair
  return images, target


def test_key_coverage_both_ways():
  cfg = lpips_model.LPIPSConfig.tiny()
  hf_keys = list(TorchLPIPS(cfg.vgg).state_dict())
  single = [KeyMap([r]) for r in RULES]
  for key in hf_keys:
    hits = sum(m.hf_to_flax(key) is not None for m in single)
    assert hits == 1, f"{key} matched by {hits} rules"
  key_map = KeyMap(RULES)
  params = [p for p, _ in nnx.to_flat_state(nnx.state(abstract(lpips_model.LPIPS, cfg), nnx.Param))]
  produced = {key_map.hf_to_flax(k)[0] for k in hf_keys}
  flax_paths = {".".join(str(getattr(s, "key", s)) for s in p) for p in params}
  assert produced == flax_paths
  for path in flax_paths:
    assert sum(m.flax_to_hf(path) is not None for m in single) == 1, path
  assert len(hf_keys) == 2 * 13 + 5


def test_parity_with_torch_oracle(setup):
  _, ref, _, fn, float_fn = setup
  images, target = _pair(0)
  want = _torch_lpips(ref, images, target)
  got = np.asarray(fn(images, target))
  np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
  assert want[1] > want[0] > 0  # the unrelated pair is farther than the perturbed one
  signed = lambda a: a.astype(np.float32) / 127.5 - 1.0  # noqa: E731
  np.testing.assert_allclose(np.asarray(float_fn(signed(images), signed(target))), want,
                             rtol=0, atol=ATOL)


def test_features_parity(setup):
  cfg, ref, ours, _, _ = setup
  x = np.random.default_rng(1).uniform(-1, 1, (2, 33, 35, 3)).astype(np.float32)  # odd sizes: floor pooling
  with torch.no_grad():
    want = ref.taps(torch.from_numpy(x).permute(0, 3, 1, 2))
  got = ours.vgg(jnp.asarray(x))
  for w, g in zip(want, got):
    assert g.shape == tuple(w.permute(0, 2, 3, 1).shape)
    np.testing.assert_allclose(np.asarray(g), w.permute(0, 2, 3, 1).numpy(), rtol=0, atol=ATOL)


def test_identical_images_give_zero(setup):
  _, _, _, fn, _ = setup
  images, _ = _pair(2)
  np.testing.assert_array_equal(np.asarray(fn(images, images)), 0.0)


def test_reward_is_negative_lpips(setup):
  _, ref, ours, _, _ = setup
  images, target = _pair(0)
  reward = lpips_lib.make_lpips_reward(ours)
  got = np.asarray(jax.jit(lambda x, t: reward(x, None, {"target_image": t}))(images, target))
  np.testing.assert_allclose(got, -_torch_lpips(ref, images, target), rtol=0, atol=ATOL)
  with pytest.raises(ValueError, match=r"needs metadata\['target_image'\]"):
    reward(images, None, {})
  with pytest.raises(ValueError, match=r"target_image shape \(2, 40, 48, 3\) != images shape"):
    reward(images, None, {"target_image": target[:2]})
  with pytest.raises(ValueError, match="must be uint8"):
    reward(images.astype(np.float32), None, {"target_image": target})
  with pytest.raises(ValueError, match="smaller than 16 px"):
    reward(images[:, :8, :8], None, {"target_image": target[:, :8, :8]})


def _write_published_layout(ref, directory, fmt):
  """ref's weights split into the two published files (torchvision vgg16 + lpips heads)."""
  sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
  vgg = {k: v for k, v in sd.items() if k.startswith("features.")}
  vgg["classifier.0.weight"] = np.zeros((4, 2), np.float32)  # torchvision's FC head, dropped
  heads = {k: v for k, v in sd.items() if k.startswith("lin")}
  paths = os.path.join(directory, f"vgg16.{fmt}"), os.path.join(directory, f"lpips_vgg.{fmt}")
  for path, d in zip(paths, (vgg, heads)):
    if fmt == "pth":
      torch.save({k: torch.from_numpy(v) for k, v in d.items()}, path)
    else:
      safetensors.numpy.save_file(d, path)
  return paths


@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
def test_converter_round_trip(setup, tmp_path, fmt):
  cfg, ref, _, fn, _ = setup
  vgg_path, head_path = _write_published_layout(ref, tmp_path, fmt)
  out = tmp_path / "lpips_vgg"
  assert lpips_convert.main(["--vgg16", vgg_path, "--lpips", head_path, "--out_dir", str(out)]) == 0
  with open(out / "config.json") as f:
    assert lpips_model.LPIPSConfig.from_hf(json.load(f)) == cfg
  reward = lpips_lib.lpips_reward_factory(weights_dir=str(out))
  images, target = _pair(3)
  got = jax.jit(lambda x, t: reward(x, None, {"target_image": t}))(images, target)
  np.testing.assert_allclose(np.asarray(got), -np.asarray(fn(images, target)), rtol=0, atol=1e-6)
  if fmt == "safetensors":  # the registered reward, built by the composer from its config
    composer = rewards.RewardComposer([{"name": "lpips", "weight": 2.0, "kwargs": {"weights_dir": str(out)}}])
    total, parts = composer(images, ["p"] * 3, {"target_image": target})
    np.testing.assert_allclose(parts["lpips"], np.asarray(got), rtol=0, atol=1e-6)
    np.testing.assert_allclose(total, 2 * np.asarray(got), rtol=0, atol=1e-6)


def test_converter_errors(setup, tmp_path, capsys):
  _, ref, _, _, _ = setup
  vgg_path, head_path = _write_published_layout(ref, tmp_path, "safetensors")
  heads = safetensors.numpy.load_file(head_path)
  del heads["lin4.model.1.weight"]
  heads["lin0.model.1.bias"] = np.zeros(1, np.float32)
  bad = str(tmp_path / "bad_heads.safetensors")
  safetensors.numpy.save_file(heads, bad)
  assert lpips_convert.main(["--vgg16", vgg_path, "--lpips", bad, "--out_dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert "missing (1): lin4.model.1.weight (for heads.4.kernel)" in err
  assert "unexpected (1): lin0.model.1.bias" in err
  assert not (tmp_path / "o").exists()
  with pytest.raises(FileNotFoundError, match="no weights file"):
    lpips_convert.convert_lpips(str(tmp_path / "nope.pth"), head_path, str(tmp_path / "o"))
  with pytest.raises(ValueError, match="not a torchvision vgg16 state_dict"):
    lpips_convert.convert_lpips(head_path, vgg_path, str(tmp_path / "o"))
  with pytest.raises(FileNotFoundError, match="has no config.json"):
    lpips_lib.lpips_reward_factory(weights_dir=str(tmp_path))


def test_configs():
  full = lpips_model.LPIPSConfig.full()
  assert full.vgg.block_channels == (64, 128, 256, 512, 512)
  assert lpips_model.LPIPSConfig.from_hf(full.to_hf()) == full
  model = nnx.eval_shape(lambda: lpips_model.LPIPS(full, rngs=nnx.Rngs(0)))
  n = sum(int(np.prod(v.shape)) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
  assert n == 14_714_688 + 1472  # torchvision vgg16 features + the five heads
  graphdef, state = nnx.split(model)
  image = jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.uint8)
  out = jax.eval_shape(lambda s, x, y: nnx.merge(graphdef, s)(x, y), state, image, image)
  assert out.shape == (2,)
  with pytest.raises(ValueError, match="only net='vgg' version='0.1'"):
    lpips_model.LPIPSConfig.from_hf({"net": "alex", "version": "0.1"})
  with pytest.raises(ValueError, match="must have 5 entries"):
    VGG16Config(block_channels=(4, 8))
  with pytest.raises(ValueError, match=r"VGG16 input must be \[B, H, W, 3\]"):
    abstract(VGG16Features, VGG16Config.tiny())(jnp.zeros((1, 32, 32, 4)))
