"""--to_hf of a run that trained the DiT decoder: its step folders hold a `decoder_params` item (the whole DiT,
or with checkpoints/decoder_lora.json the DiT's adapters) next to the AR's `params` (absent when only the
decoder trains).

Checked as a user would: diffusers loads the exported transformer/; the DiT adapter, loaded by
`GlmImageTransformer2DModel.load_lora_adapter` onto the exported base, gives the --merge_lora export's
output and our adapted Flax DiT's (float32, max abs: diffusers adapter vs diffusers merged 1e-5, vs our
DiT 1e-4 as the DiT parity tests), and the adapters move the output by far more than that.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import glmrl  # noqa: F401  (first: disables flax eager sharding)
import diffusers
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import safetensors
import torch
import transformers
from flax import nnx

from checkpoints_convert import flax_to_hf, hf_to_flax, peft
from checkpoints_convert.components import load_component
from checkpoints_convert.maps.dit import RULES
from checkpoints_convert.rules import KeyMap, flax_path_str
from glmrl.checkpoint import manager
from glmrl.policy import ar as ar_policy
from glmrl.policy import dit
from glmrl.models import lora
from glmrl.models.dit.config import DiTConfig
from tests.checkpoints_convert import tiny_folders
from tests.cli import TIMEOUT_S
from tests.models.dit import torch_ref

ROOT = pathlib.Path(__file__).resolve().parents[2]
AR, DIT = "vision_language_encoder", "transformer"
RANK, ALPHA = 4, 6.0  # scale 1.5: an adapter loaded with alpha = rank (diffusers' default) would show
ADAPTER_ATOL = 1e-5   # diffusers adapter vs diffusers merged kernels
PORT_ATOL = 1e-4      # diffusers vs our DiT (tests/models/dit)
ITEMS = ("params", "opt_state", "rng", "meta", dit.SAVED.params, dit.SAVED.opt_state,
         dit.SAVED.ema)
quiet = lambda s: None


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """A converted folder of the tiny AR and DiT (what config.model.checkpoint_dir takes)."""
  root = tmp_path_factory.mktemp("source")
  tiny_folders.write_folder(root / "hf", {n: tiny_folders.reference_model(n) for n in (AR, DIT)},
                            pipeline_files=False)
  hf_to_flax.convert_pipeline(str(root / "hf"), str(root / "converted"), log=quiet)
  return root / "converted"


def write_run(workdir, converted, decoder_state, *, decoder_lora=None, ar_state=None, ar_lora=None, source=True,
              dit_config=True, decoder_ema=None):
  """`workdir`/checkpoints as a decoder-RL run writes it: step 3 with `ar_state` (default: the whole AR) in
  `params` and `decoder_state` in `decoder_params`, ar_config.json, source.json, dit_config.json, and the
  LoRA records lora.json / decoder_lora.json of adapter states; `decoder_ema` in `decoder_ema` when given."""
  ckpt = pathlib.Path(workdir) / "checkpoints"
  if ar_state is None:
    ar_state = nnx.state(load_component(str(converted / AR)), nnx.Param)
  with ocp.CheckpointManager(ckpt, item_names=ITEMS) as mngr:
    mngr.save(3, args=ocp.args.Composite(
        params=ocp.args.StandardSave(ar_state), meta=ocp.args.JsonSave({"step": 3}),
        **{dit.SAVED.params: ocp.args.StandardSave(decoder_state)},
        **({} if decoder_ema is None else {dit.SAVED.ema: ocp.args.StandardSave(decoder_ema)})))
    mngr.wait_until_finished()
  shutil.copy(converted / AR / "config.json", ckpt / manager.AR_CONFIG_FILE)
  with open(ckpt / manager.SOURCE_FILE, "w") as f:
    json.dump({"checkpoint_dir": str(converted) if source else ""}, f)
  if dit_config:
    with open(ckpt / dit.SAVED.model_config_file, "w") as f:
      json.dump(DiTConfig.tiny().to_hf(), f)
  for record, name in ((decoder_lora, dit.SAVED.adapters_file), (ar_lora, ar_policy.SAVED.adapters_file)):
    if record is not None:
      with open(ckpt / name, "w") as f:
        json.dump(record, f)
  return pathlib.Path(workdir)


@pytest.fixture(scope="module")
def full_run(converted, tmp_path_factory):
  """(workdir, trained DiT {hf key: HF-layout array}): full DiT fine-tuning moved every weight."""
  state = nnx.state(load_component(str(converted / DIT)), nnx.Param)
  rng = np.random.default_rng(0)
  trained = jax.tree.map(lambda x: x + rng.standard_normal(x.shape).astype(np.float32), state)
  key_map, want = KeyMap(RULES), {}
  for path, value in nnx.to_flat_state(trained):
    hf_key, transform = key_map.flax_to_hf(flax_path_str(path))
    want[hf_key] = transform.to_hf(np.asarray(value))
  return write_run(tmp_path_factory.mktemp("full") / "workdir", converted, trained), want


def adapted(component_dir, targets, seed: int):
  """(model with trained adapters: nonzero random lora_b, its adapters' state, the run's LoRA record)."""
  model = load_component(str(component_dir))
  lora.apply_lora(model, lora.LoraConfig(RANK, ALPHA, targets=targets), nnx.Rngs(seed))
  rng = np.random.default_rng(seed)
  for path, variable in nnx.to_flat_state(nnx.state(model, lora.LoraParam)):
    if path[-1] == "lora_b":
      variable[...] = 0.2 * rng.standard_normal(variable.shape).astype(np.float32)
  _, adapters, _ = nnx.split(model, lora.LoraParam, ...)
  record = {"rank": RANK, "alpha": ALPHA, "targets": list(targets),
            "base": {"checkpoint_dir": str(component_dir.parent), "fingerprint": "test"}}
  return model, adapters, record


@pytest.fixture(scope="module")
def lora_run(converted, tmp_path_factory):
  """(workdir, our DiT with the trained adapters): DiT LoRA, the AR fully fine-tuned."""
  model, adapters, record = adapted(converted / DIT, lora.DIT_TARGETS, seed=2)
  return write_run(tmp_path_factory.mktemp("lora") / "workdir", converted, adapters, decoder_lora=record), model


def assert_transformer_is(directory, want: dict):
  got = diffusers.GlmImageTransformer2DModel.from_pretrained(directory).state_dict()
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key].numpy(), value, err_msg=key)


def test_full_dit_is_written_from_decoder_params(full_run, converted, tmp_path):
  workdir, want = full_run
  out = tmp_path / "hf"
  result = flax_to_hf.export(str(workdir), str(out), log=quiet)
  assert result["step"] == 3 and set(result["exported"]) == {AR, DIT}
  assert_transformer_is(out / DIT, want)
  assert json.loads((out / DIT / "config.json").read_text()) == json.loads(
      (converted / DIT / "config.json").read_text())  # the source's own config.json
  before = diffusers.GlmImageTransformer2DModel.from_pretrained(converted.parent / "hf" / DIT).state_dict()
  assert all(not np.array_equal(before[k].numpy(), v) for k, v in want.items())


def test_full_dit_without_source_uses_dit_config(full_run, tmp_path):
  workdir, want = full_run
  result = flax_to_hf.export(str(workdir), str(tmp_path / "hf"), source_dir="", log=quiet)
  assert set(result["exported"]) == {AR, DIT}
  assert "only vision_language_encoder, transformer were written" in result["incomplete_reason"]
  assert_transformer_is(tmp_path / "hf" / DIT, want)

  # A run that recorded no DiT config has nothing to write the DiT with: said, not guessed.
  bare = tmp_path / "bare"
  shutil.copytree(workdir, bare)
  os.remove(bare / "checkpoints" / dit.SAVED.model_config_file)
  result = flax_to_hf.export(str(bare), str(tmp_path / "hf2"), source_dir="", log=quiet)
  assert set(result["exported"]) == {AR}
  assert not (tmp_path / "hf2" / DIT).exists()
  reason = result["incomplete_reason"]
  assert f"the trained transformer ({bare / 'checkpoints' / '3' / dit.SAVED.params}) was not written" in reason
  assert f"{bare / 'checkpoints' / dit.SAVED.model_config_file} is missing" in reason


def test_decoder_only_run_takes_the_generator_from_the_source(full_run, converted, tmp_path):
  """A run that trains only the DiT writes no `params` item: the generator is the source's."""
  workdir, want = full_run
  decoder_only = tmp_path / "workdir"
  shutil.copytree(workdir, decoder_only)
  shutil.rmtree(decoder_only / "checkpoints" / "3" / "params")
  result = flax_to_hf.export(str(decoder_only), str(tmp_path / "hf"), log=quiet)
  assert result["step"] == 3 and set(result["exported"]) == {AR, DIT}
  assert_transformer_is(tmp_path / "hf" / DIT, want)
  got, before = (transformers.GlmImageForConditionalGeneration.from_pretrained(d / AR).state_dict()
                 for d in (tmp_path / "hf", converted.parent / "hf"))
  assert list(got) == list(before) and all(torch.equal(got[k], v) for k, v in before.items())
  with pytest.raises(ValueError, match=r"holds no LoRA adapters \(no decoder_lora.json\); its decoder is exported"):
    flax_to_hf.export(str(decoder_only), str(tmp_path / "hf2"), merge_lora=True, log=quiet)


def _diffusers_out(model, inputs):
  return torch_ref.ref_forward(model, **inputs, prior_token_drop=np.zeros(inputs["prior_token_ids"].shape, bool))


def test_dit_lora_adapter_loads_in_diffusers_and_matches_merged_and_ours(lora_run, converted, tmp_path):
  workdir, model = lora_run
  adapter_out, merged_out = tmp_path / "adapter", tmp_path / "merged"
  cli = subprocess.run([sys.executable, "-m", "checkpoints_convert", "--to_hf", f"--ckpt_dir={workdir}",
                        f"--hf_out_dir={adapter_out}"], capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT_S)
  assert cli.returncode == 0, cli.stderr[-3000:]
  result = flax_to_hf.export(str(workdir), str(merged_out), merge_lora=True, log=quiet)
  assert set(result["exported"]) == {AR, DIT}
  assert not (merged_out / peft.ADAPTERS_DIR).exists()

  adapter_dir = adapter_out / peft.ADAPTERS_DIR / DIT
  assert sorted(os.listdir(adapter_dir)) == [peft.DIFFUSERS_ADAPTER_WEIGHTS]
  assert sorted(os.listdir(adapter_out / peft.ADAPTERS_DIR)) == [DIT]  # the AR was fully fine-tuned
  with safetensors.safe_open(adapter_dir / peft.DIFFUSERS_ADAPTER_WEIGHTS, "pt") as f:
    keys, meta = set(f.keys()), json.loads(f.metadata()[peft.DIFFUSERS_METADATA_KEY])
  assert "transformer.transformer_blocks.0.attn1.to_q.lora_A.weight" in keys
  assert "transformer.transformer_blocks.1.ff.net.0.proj.lora_B.weight" in keys
  assert (meta["transformer.r"], meta["transformer.lora_alpha"]) == (RANK, ALPHA)

  base = diffusers.GlmImageTransformer2DModel.from_pretrained(adapter_out / DIT).eval()
  inputs = torch_ref.t2i_inputs(DiTConfig.tiny(), seed=1, batch=2, height=8, width=12, text_len=5)
  without = _diffusers_out(base, inputs)
  base.load_lora_adapter(str(adapter_dir), weight_name=peft.DIFFUSERS_ADAPTER_WEIGHTS, prefix="transformer")
  (peft_config,) = base.peft_config.values()
  assert (peft_config.r, peft_config.lora_alpha) == (RANK, ALPHA)
  got = _diffusers_out(base, inputs)
  merged = _diffusers_out(diffusers.GlmImageTransformer2DModel.from_pretrained(merged_out / DIT).eval(), inputs)
  ours = np.asarray(torch_ref.forward(model, inputs))
  assert torch_ref.max_abs(got, merged) < ADAPTER_ATOL
  assert torch_ref.max_abs(got, ours) < PORT_ATOL
  assert torch_ref.max_abs(got, without) > 1e-2  # the adapters matter


def test_use_ema_exports_the_moving_average_and_diffusers_loads_it(converted, tmp_path):
  """--use_ema writes the decoder's `decoder_ema` item (the adapters' average) in place of its adapters."""
  _, adapters, record = adapted(converted / DIT, lora.DIT_TARGETS, seed=2)
  ema_model, ema_adapters, _ = adapted(converted / DIT, lora.DIT_TARGETS, seed=5)
  workdir = write_run(tmp_path / "workdir", converted, adapters, decoder_lora=record, decoder_ema=ema_adapters)
  out = tmp_path / "ema"
  cli = subprocess.run([sys.executable, "-m", "checkpoints_convert", "--to_hf", f"--ckpt_dir={workdir}",
                        f"--hf_out_dir={out}", "--use_ema"], capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT_S)
  assert cli.returncode == 0, cli.stderr[-3000:]
  base = diffusers.GlmImageTransformer2DModel.from_pretrained(out / DIT).eval()
  base.load_lora_adapter(str(out / peft.ADAPTERS_DIR / DIT), weight_name=peft.DIFFUSERS_ADAPTER_WEIGHTS,
                         prefix="transformer")
  inputs = torch_ref.t2i_inputs(DiTConfig.tiny(), seed=1, batch=2, height=8, width=12, text_len=5)
  assert torch_ref.max_abs(_diffusers_out(base, inputs), np.asarray(torch_ref.forward(ema_model, inputs))) < PORT_ATOL
  # A run without an average: one line naming what is missing, nothing written.
  plain = write_run(tmp_path / "plain", converted, adapters, decoder_lora=record)
  with pytest.raises(ValueError, match="--use_ema: .* holds no 'decoder_ema' item"):
    flax_to_hf.export(str(plain), str(tmp_path / "none"), use_ema=True, log=quiet)
  assert not (tmp_path / "none").exists()


def test_dit_lora_without_source(lora_run, tmp_path):
  workdir, _ = lora_run
  out = tmp_path / "hf"
  with pytest.raises(ValueError, match=rf"--merge_lora needs the base the adapters of "
                                       rf"{workdir / 'checkpoints' / '3' / dit.SAVED.params} .*source_dir=''"):
    flax_to_hf.export(str(workdir), str(out), source_dir="", merge_lora=True, log=quiet)
  assert not out.exists()  # refused before anything was written
  result = flax_to_hf.export(str(workdir), str(out), source_dir="", log=quiet)
  assert set(result["exported"]) == {AR, f"{peft.ADAPTERS_DIR}/{DIT}"}
  assert result["complete"] is False and "--source_dir=''" in result["incomplete_reason"]


def test_ar_and_dit_adapters(converted, tmp_path):
  """LoRA on both: each adapter in its own format under adapters/, or both merged into their bases."""
  _, ar_adapters, ar_record = adapted(converted / AR, lora.AR_TARGETS, seed=3)
  _, dit_adapters, dit_record = adapted(converted / DIT, lora.DIT_TARGETS, seed=4)
  workdir = write_run(tmp_path / "workdir", converted, dit_adapters, decoder_lora=dit_record, ar_state=ar_adapters,
                      ar_lora=ar_record)
  result = flax_to_hf.export(str(workdir), str(tmp_path / "adapter"), log=quiet)
  assert set(result["exported"]) == {AR, DIT, f"{peft.ADAPTERS_DIR}/{AR}", f"{peft.ADAPTERS_DIR}/{DIT}"}
  adapters = tmp_path / "adapter" / peft.ADAPTERS_DIR
  assert sorted(os.listdir(adapters / AR)) == [peft.ADAPTER_CONFIG, peft.ADAPTER_WEIGHTS]
  assert sorted(os.listdir(adapters / DIT)) == [peft.DIFFUSERS_ADAPTER_WEIGHTS]
  source = diffusers.GlmImageTransformer2DModel.from_pretrained(converted.parent / "hf" / DIT).state_dict()
  assert_transformer_is(tmp_path / "adapter" / DIT, {k: v.numpy() for k, v in source.items()})  # the base

  result = flax_to_hf.export(str(workdir), str(tmp_path / "merged"), merge_lora=True, log=quiet)
  assert set(result["exported"]) == {AR, DIT} and not (tmp_path / "merged" / peft.ADAPTERS_DIR).exists()
  merged = diffusers.GlmImageTransformer2DModel.from_pretrained(tmp_path / "merged" / DIT).state_dict()
  a = np.asarray(dit_adapters["blocks"][0]["attn"]["q"]["lora_a"][...])
  b = np.asarray(dit_adapters["blocks"][0]["attn"]["q"]["lora_b"][...])
  key = "transformer_blocks.0.attn1.to_q.weight"
  np.testing.assert_allclose(merged[key].numpy(), source[key].numpy() + (ALPHA / RANK) * (a @ b).T, atol=1e-6)
