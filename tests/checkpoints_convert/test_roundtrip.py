"""HF -> Flax -> HF through the CLI on a tiny sharded GLM-Image folder (all components).

The AR generator is saved in bf16 (as released) to check dtypes survive; the others in f32.
Round trip: same keys, dtypes, shapes and bytes. Exported folders load with the reference
`from_pretrained` and give bit-identical outputs (torch.equal) to the source folders.
"""

import filecmp
import os
import types

import glmrl  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from checkpoints_convert import components
from checkpoints_convert.components import load_component
from glmrl.checkpoint import params as params_lib
from checkpoints_convert import safetensors_stream as st
from checkpoints_convert.__main__ import main
from tests.checkpoints_convert import tiny_folders

COMPONENTS = tiny_folders.MODEL_COMPONENTS
SHARD = "40KB"  # every tiny component is larger, so every one is sharded both ways


def _dtype(name):
  return torch.bfloat16 if name == "vision_language_encoder" else torch.float32


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  root = tmp_path_factory.mktemp("roundtrip")
  models = {n: tiny_folders.reference_model(n, dtype=_dtype(n)) for n in COMPONENTS}
  hf, out, back = root / "hf", root / "flax", root / "hf_back"
  tiny_folders.write_folder(hf, models, max_shard_size=SHARD)
  assert main([f"--hf_dir={hf}", f"--out_dir={out}"]) == 0
  assert main(["--to_hf", f"--ckpt_dir={out}", f"--hf_out_dir={back}", f"--max_shard_size={SHARD}"]) == 0
  return types.SimpleNamespace(hf=hf, out=out, back=back, models=models)


def _reader(directory, name):
  return st.SafetensorsReader(st.find_weights(str(directory / name), components.get(name).weights_name))


def _numpy(t: torch.Tensor) -> np.ndarray:
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().view(jnp.bfloat16)
  return t.numpy()


@pytest.mark.parametrize("name", COMPONENTS)
def test_round_trip_bit_exact_from_sharded(run, name):
  weights = components.get(name).weights_name
  for d in (run.hf, run.back):
    assert os.path.isfile(d / name / (weights + ".index.json")), f"{d / name} is not sharded"
  a, b = _reader(run.hf, name), _reader(run.back, name)
  assert sorted(a.keys()) == sorted(b.keys())
  for key in a.keys():
    x, y = a.read(key), b.read(key)
    assert (x.dtype, x.shape) == (y.dtype, y.shape), key
    assert x.tobytes() == y.tobytes(), key
  want = np.dtype(jnp.bfloat16) if name == "vision_language_encoder" else np.dtype(np.float32)
  assert {a.info(k).dtype for k in a.keys()} == {want}


def test_layout_and_verbatim_files(run):
  assert filecmp.cmp(run.hf / "model_index.json", run.out / "model_index.json", shallow=False)
  assert filecmp.cmp(run.hf / "model_index.json", run.back / "model_index.json", shallow=False)
  for name in COMPONENTS:
    assert os.path.isfile(run.out / name / "params" / "_METADATA")
    for d in (run.out, run.back):
      assert filecmp.cmp(run.hf / name / "config.json", d / name / "config.json", shallow=False)
    assert not [f for f in os.listdir(run.out / name) if f.endswith(".safetensors")]
  for folder in components.COPIED_FOLDERS:
    for d in (run.out, run.back):
      cmp = filecmp.dircmp(run.hf / folder, d / folder)
      assert cmp.left_list == cmp.right_list and not cmp.diff_files and not cmp.funny_files, folder
      _, mismatch, errors = filecmp.cmpfiles(run.hf / folder, d / folder, cmp.common_files, shallow=False)
      assert not mismatch and not errors, folder


def _realigned(model):
  """Moves every tensor to a fresh allocation.

  from_pretrained leaves tensors at addresses that follow the file layout (seen:
  data_ptr % 64 of 56 vs 0 for equal bytes written in a different order), and CPU
  kernels round differently on differently aligned data (2.4e-7 seen). Fresh
  allocations make the outputs depend on the values only.
  """
  with torch.no_grad():
    for t in list(model.parameters()) + list(model.buffers()):
      t.data = t.data.clone()
  return model


@pytest.mark.parametrize("name", COMPONENTS)
def test_from_pretrained_gives_identical_outputs(run, name):
  # Both loaded the same way: a model cast with .to(bf16) also casts its rotary buffers,
  # from_pretrained does not, so the constructed model is no oracle for bf16 outputs.
  cls = tiny_folders.reference_class(name)
  original = _realigned(cls.from_pretrained(run.hf / name).eval())
  loaded = _realigned(cls.from_pretrained(run.back / name).eval())
  sd_ref = run.models[name].state_dict()
  assert list(sd_ref) == list(original.state_dict())
  assert all(torch.equal(sd_ref[k], v) for k, v in original.state_dict().items())
  sd_a, sd_b = original.state_dict(), loaded.state_dict()
  assert list(sd_a) == list(sd_b)
  for key in sd_a:
    assert sd_a[key].dtype == sd_b[key].dtype and torch.equal(sd_a[key], sd_b[key]), key
  assert torch.equal(tiny_folders.reference_output(name, original), tiny_folders.reference_output(name, loaded))


@pytest.mark.parametrize("name", COMPONENTS)
def test_load_component_holds_reference_weights(run, name):
  """load_component builds the f32 model; bf16 sources are widened exactly."""
  model = load_component(str(run.out / name))
  params = params_lib.flatten(nnx.state(model, nnx.Param))
  key_map = components.get(name).key_map()
  seen = set()
  for key, tensor in run.models[name].state_dict().items():
    path, transform = key_map.hf_to_flax(key)
    want = transform.to_flax(tensor.float().numpy())
    got = np.asarray(params[path])
    assert got.dtype == np.float32 and got.shape == want.shape, key
    np.testing.assert_array_equal(got, want, err_msg=key)
    seen.add(path)
  assert seen == set(params)


def test_load_params_dtype_and_sharding(run):
  """Restoring into a bf16 abstract state onto a mesh keeps bf16 bits and the requested sharding."""
  component = components.get("vision_language_encoder")
  cfg = component.config_from_hf(component.read_config(str(run.out / component.name)), param_dtype=jnp.bfloat16)
  abstract = nnx.state(component.build_abstract(cfg), nnx.Param)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("fsdp",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shardings = jax.tree.map(lambda _: sharding, abstract)  # a tree like the state, as a train step has
  state = params_lib.restore_params(str(run.out / component.name), abstract, shardings)
  assert isinstance(state, nnx.State) and set(params_lib.flatten(state)) == set(params_lib.flatten(abstract))
  params = params_lib.flatten(state)
  key_map = component.key_map()
  for key, tensor in run.models[component.name].state_dict().items():
    path, transform = key_map.hf_to_flax(key)
    got = params[path]
    assert got.dtype == jnp.bfloat16 and got.sharding == sharding, key
    assert np.asarray(got).tobytes() == transform.to_flax(_numpy(tensor)).tobytes(), key
