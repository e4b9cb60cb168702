"""The released-model path as users run it: configs, training, export. main.py runs as a subprocess where the run
spans 8 devices or 2 processes, and as its `__main__` in the test's process on one device (the :hps recipe).

The released recipes train on the converted folder, shrunk by flags, each as on a pod, 2 processes x 4 host
devices, against a run of 1 process x 8 that the other worker makes first (`makes_reference`) and that carries the
checks of one process: the same per-step metrics (`tests.train.processes.pod_and_single`), with 16 images decoded in
two calls and micro-batches of 4 rows over 8 devices (each partly replicated). So train the text-to-image recipe, its
LoRA variant, the image-to-image recipe (with an evaluation during training) and the decoupled recipe with Flow-GRPO
and with DiffusionNFT on the decoder; the decoupled recipe (the LoRA recipe, whose generator adapters it trains, with
the decoder's adapters beside) is exported from the checkpoints its two processes wrote. The demo's pod test also
resumes, evaluates and generates as 2 processes (tests/train/test_multihost.py). The text-to-image recipes'
JPEG-size reward (discontinuous in the pixels) is weighted 1e-4 beside brightness (tests/train/test_multihost.py says
why).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.cli import ROOT, TIMEOUT_S, captured_output, completed
from tests.train.processes import launch, pod_and_single


def _rows(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


POD = ("--config.data.height=64", "--config.data.width=64", "--config.sampling.dit_steps=2",
       "--config.grpo.group_size=8", "--config.data.prompts_per_step=2", "--config.train.micro_batch_size=4",
       "--config.checkpoint.save_interval=2", "--config.log.image_interval=1", "--config.train.num_steps=2")
# The tiny decoupled recipe trains both policies at 1e-2; with DiffusionNFT the two launches' step-2 generator
# gradient norms were then 10% apart (other tokens sampled after an update that moves each adapter weight by about
# the learning rate, as with the LoRA recipe below).
DECOUPLED = ("--config.data.height=64", "--config.data.width=64", "--config.checkpoint.save_interval=2",
             "--config.log.image_interval=1", "--config.train.num_steps=2", "--config.optim.learning_rate=1e-3",
             "--config.decoder.optim.learning_rate=1e-3")
CONTINUOUS = "--config.rewards=({'name': 'brightness', 'weight': 1.0}, {'name': 'jpeg_compressibility', 'weight': 1e-4})"


@pytest.fixture(scope="session")
def converted(tiny_released):
  """A tiny released-layout folder written by transformers/diffusers, converted by the command line (once per
  session: tests/conftest.py)."""
  return tiny_released


def _single(shared_runs, converted, recipe):
  """`recipe(converted)`'s flags trained as 1 process x 8 devices, made once per session (the shared run
  `<recipe>_1x8`, e.g. `t2i_1x8`): the reference of that recipe's pod test."""
  name = f"{recipe.__name__.strip('_')}_1x8"
  return shared_runs(name, lambda folder: launch(folder, *recipe(converted), processes=1, devices=8))


def _pod(tmp_path, shared_runs, converted, recipe):
  """`recipe(converted)` as 2 processes x 4 against its reference (`_single`): `pod_and_single`'s (multi, single)."""
  return pod_and_single(tmp_path, *recipe(converted), single=lambda: _single(shared_runs, converted, recipe))


def _t2i(converted):
  _, ckpt = converted
  return ("--config=configs/glm_image_t2i.py", f"--config.model.checkpoint_dir={ckpt}",
          "--config.data.prompts_file=configs/data/demo_prompts.txt", *POD, CONTINUOUS)


@pytest.mark.makes_reference
def test_released_t2i_config_trains_and_its_export_loads_in_diffusers(converted, shared_runs, tmp_path):
  """configs/glm_image_t2i.py on the converted folder (bfloat16 compute, as released) on 8 devices, then --to_hf:
  diffusers loads the complete pipeline folder with the run's generator and the source's frozen decoder."""
  import diffusers
  import torch

  hf_dir, _ = converted
  workdir = _single(shared_runs, converted, _t2i)
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:  # bf16 compute, as released: the on-policy ratio is still exactly 1
    assert r["first_iter/ratio/min"] == r["first_iter/ratio/max"] == 1.0, r
  pipe = diffusers.GlmImagePipeline.from_pretrained(_export(workdir, tmp_path / "exported"))
  generation = pipe.vision_language_encoder.generation_config
  assert (generation.temperature, generation.top_p) == (0.9, 0.75)
  source = diffusers.GlmImagePipeline.from_pretrained(hf_dir)
  trained, before = pipe.vision_language_encoder.state_dict(), source.vision_language_encoder.state_dict()
  assert trained.keys() == before.keys()
  assert any(not torch.equal(trained[k], before[k]) for k in trained)  # two updates moved the generator
  for a, b in zip(pipe.transformer.state_dict().values(), source.transformer.state_dict().values()):
    assert torch.equal(a, b)  # the frozen decoder is the source's


@pytest.mark.xdist_group("pod")
def test_released_t2i_config_trains_as_two_processes(converted, shared_runs, tmp_path):
  _pod(tmp_path, shared_runs, converted, _t2i)


def _lora(converted):
  """configs/glm_image_t2i_lora.py:tiny on the converted folder. Its learning rate 1e-2 moves each adapter weight by
  about that much per update, and the two layouts then sampled other tokens at step 2 (rewards 0.18% apart in mean,
  18% in spread): 1e-3 here."""
  _, ckpt = converted
  return ("--config=configs/glm_image_t2i_lora.py:tiny", f"--config.model.checkpoint_dir={ckpt}", *POD, CONTINUOUS,
          "--config.optim.learning_rate=1e-3")


@pytest.mark.makes_reference
def test_released_lora_config_trains_its_adapters_on_eight_devices(converted, shared_runs):
  """configs/glm_image_t2i_lora.py:tiny: on-policy at every step, the adapters' record (their settings and base)
  beside the checkpoint of step 2 (their exports: the decoupled pod test below, which trains the same generator
  adapters)."""
  workdir = _single(shared_runs, converted, _lora)
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert r["first_iter/ratio/min"] == r["first_iter/ratio/max"] == 1.0, r
  record = json.loads((workdir / "checkpoints" / "lora.json").read_text())
  assert (record["rank"], record["alpha"]) == (4, 8.0), record
  assert (workdir / "checkpoints" / "2" / "params").is_dir()


@pytest.mark.xdist_group("pod")
def test_released_lora_config_trains_as_two_processes(converted, shared_runs, tmp_path):
  multi, single = _pod(tmp_path, shared_runs, converted, _lora)
  assert (multi / "checkpoints" / "lora.json").read_text() == (single / "checkpoints" / "lora.json").read_text()


def _i2i(converted):
  _, ckpt = converted
  return ("--config=configs/glm_image_i2i.py", f"--config.model.checkpoint_dir={ckpt}",
          "--config.data.prompts_file=configs/data/i2i_demo.jsonl", *POD, "--config.train.num_steps=3",
          "--config.eval.interval=2", "--config.eval.prompts_file=configs/data/i2i_demo.jsonl")


def _assert_trained_past_evaluation(workdir):
  """The update donates the generator's arrays; nothing else (pipeline, condition-image tokenizer, the evaluation at
  step 2) may hold them: step 3 runs after the evaluation."""
  rows = _rows(workdir)
  assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
  evaluations = [r for r in rows if "eval/reward/mean" in r]
  assert [r["step"] for r in evaluations] == [2]
  for r in rows:
    if "reward/mean" in r:
      assert r["first_iter/ratio/min"] == r["first_iter/ratio/max"] == 1.0, r
  return evaluations[0]["eval/reward/mean"]


@pytest.mark.makes_reference
def test_released_i2i_config_trains_and_evaluates_past_step_two(converted, shared_runs):
  _assert_trained_past_evaluation(_single(shared_runs, converted, _i2i))


@pytest.mark.xdist_group("pod")
def test_released_i2i_config_trains_and_evaluates_as_two_processes(converted, shared_runs, tmp_path):
  """The evaluation at step 2 as well: its reward is one of the per-step metrics compared (`pod_and_single`)."""
  multi, _ = _pod(tmp_path, shared_runs, converted, _i2i)
  _assert_trained_past_evaluation(multi)


def _ar_inputs(cfg):
  """Two left-padded text-to-image prompts of plain text ids, with their M-RoPE positions (transformers')."""
  import torch

  rng = np.random.default_rng(0)
  text = (cfg.text.vision_vocab_size, cfg.text.pad_token_id)
  seqs = [list(rng.integers(*text, n)) + [cfg.image_start_token_id] for n in (7, 4)]
  length = max(len(s) for s in seqs)
  ids = np.full((2, length), cfg.text.pad_token_id, np.int64)
  mask = np.zeros((2, length), np.int64)
  for b, s in enumerate(seqs):
    ids[b, length - len(s):], mask[b, length - len(s):] = s, 1
  return torch.tensor(ids), torch.tensor(mask), torch.tensor([[1, 2, 2], [1, 4, 4]] * 2), torch.tensor([2, 2])


def _export(workdir, out_dir, *extra, in_process: bool = False):
  """`python -m checkpoints_convert --to_hf` of the run in `workdir`: a new process, or its `main` in this one (what
  the command runs, without another start-up of Python, JAX and torch)."""
  argv = ["--to_hf", f"--ckpt_dir={workdir}", f"--hf_out_dir={out_dir}", *extra]
  if in_process:
    from checkpoints_convert.__main__ import main

    with captured_output() as out:
      code = main(argv)
    assert code == 0, out["stderr"][-3000:]
    assert "complete GLM-Image pipeline folder" in out["stdout"] + out["stderr"]
    return out_dir
  out = subprocess.run([sys.executable, "-m", "checkpoints_convert", *argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=TIMEOUT_S)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "complete GLM-Image pipeline folder" in out.stdout + out.stderr
  return out_dir


def _decoupled(converted):
  """The decoupled recipe's flags: configs/glm_image_t2i_decoupled.py:tiny on the converted folder with remat."""
  _, ckpt = converted
  # The tiny recipe's shapes: 2 prompts x 4 token grids x 2 decoder samples = 16 images.
  return ("--config=configs/glm_image_t2i_decoupled.py:tiny", f"--config.model.checkpoint_dir={ckpt}",
          "--config.model.remat=True", "--config.decoder.train_steps=3", *DECOUPLED)


@pytest.mark.makes_reference
def test_the_decoupled_recipe_trains_on_eight_devices_of_one_process(shared_runs, converted):
  """Both policies on-policy at every step, each one's trained state in the checkpoint of step 2."""
  single = _single(shared_runs, converted, _decoupled)
  rows = _rows(single)
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r[f"{p}first_iter/ratio/min"] == r[f"{p}first_iter/ratio/max"] == 1.0
             for r in rows for p in ("ar/", "decoder/"))
  assert {"params", "opt_state", "decoder_params", "decoder_opt_state"} <= set(os.listdir(single / "checkpoints" / "2"))


@pytest.mark.xdist_group("pod")
def test_decoupled_run_as_two_processes_exports_adapters_that_peft_and_diffusers_load(converted, shared_runs,
                                                                                      tmp_path):
  """configs/glm_image_t2i_decoupled.py:tiny on the converted folder with remat (the DiT's blocks rematerialised
  in sampling and in its update), as 2 processes, then --to_hf with and without --merge_lora. The generator's
  adapter, loaded by peft onto transformers' generator, gives our adapted model's logits (float32, 1e-4 max abs),
  and the merged export the same; the DiT adapters load into diffusers' transformer with the run's rank and alpha
  and change its prediction, and the merged transformer predicts what the adapted one does (1e-4 max abs)."""
  import diffusers
  import jax.numpy as jnp
  import torch
  from flax import nnx
  from peft import PeftModel
  from transformers import GlmImageForConditionalGeneration

  from configs import glm_image_t2i_decoupled
  from glmrl.checkpoint.manager import restore_trained_params
  from glmrl.train import setup

  _, ckpt = converted
  workdir, _ = _pod(tmp_path, shared_runs, converted, _decoupled)
  rows = _rows(workdir)
  assert all(r[f"{p}first_iter/ratio/min"] == r[f"{p}first_iter/ratio/max"] == 1.0
             for r in rows for p in ("ar/", "decoder/"))
  exported = _export(workdir, tmp_path / "adapter")
  merged_dir = _export(workdir, tmp_path / "merged", "--merge_lora", in_process=True)
  adapter_dir = exported / "adapters" / "vision_language_encoder"
  assert sorted(os.listdir(adapter_dir)) == ["adapter_config.json", "adapter_model.safetensors"]
  assert not (merged_dir / "adapters").exists()

  # The generator. Ours: the run's base with the restored adapters of step 2.
  config = glm_image_t2i_decoupled.get_config("tiny")
  config.model.checkpoint_dir = str(ckpt)
  run = setup.build(config)
  restored, step = restore_trained_params(str(workdir), {"params": run.states["ar"].checkpoint_params()})
  adapters = restored["params"]
  assert step == 2
  model = nnx.merge(run.states["ar"].graphdef, adapters, run.states["ar"].frozen)
  ids, mask, grids, per_sample = _ar_inputs(run.pipeline.configs.ar)
  base = GlmImageForConditionalGeneration.from_pretrained(exported / "vision_language_encoder").eval()
  pos, _ = base.model.get_rope_index(ids, image_grid_thw=grids, images_per_sample=per_sample, attention_mask=mask)
  peft_model = PeftModel.from_pretrained(base, adapter_dir).eval()
  merged = GlmImageForConditionalGeneration.from_pretrained(merged_dir / "vision_language_encoder").eval()
  with torch.no_grad():
    want = peft_model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.numpy()
    want_merged = merged(input_ids=ids, attention_mask=mask, position_ids=pos).logits.numpy()
    with peft_model.disable_adapter():
      without = peft_model.get_base_model()(input_ids=ids, attention_mask=mask, position_ids=pos).logits.numpy()
  got = np.asarray(nnx.jit(type(model).__call__)(model, jnp.asarray(ids.numpy()), jnp.asarray(pos.numpy()),
                                                 jnp.asarray(mask.numpy())))
  valid = mask.numpy().astype(bool)
  np.testing.assert_allclose(got[valid], want[valid], rtol=0, atol=1e-4)
  np.testing.assert_allclose(want_merged[valid], want[valid], rtol=0, atol=1e-4)
  assert np.abs(without[valid] - want[valid]).max() > 1e-3  # two updates moved the adapted model

  # The decoder.
  transformer = diffusers.GlmImagePipeline.from_pretrained(exported).transformer.eval()
  rng = np.random.default_rng(0)
  cfg = transformer.config
  inputs = dict(
      hidden_states=torch.tensor(rng.normal(size=(1, cfg.in_channels, 8, 8)), dtype=torch.float32),
      encoder_hidden_states=torch.tensor(rng.normal(size=(1, 4, cfg.text_embed_dim)), dtype=torch.float32),
      prior_token_id=torch.tensor(rng.integers(0, cfg.prior_vq_quantizer_codebook_size, size=(1, 16))),
      prior_token_drop=torch.zeros((1, 16), dtype=torch.bool), timestep=torch.tensor([500.0]),
      target_size=torch.tensor([[64.0, 64.0]]), crop_coords=torch.zeros((1, 2)), return_dict=False)
  with torch.no_grad():
    before = transformer(**inputs)[0]
    # As docs/conversion.md shows it: diffusers 0.42's load_lora_adapter looks for a .bin unless told the file.
    transformer.load_lora_adapter(str(exported / "adapters" / "transformer"),
                                  weight_name="pytorch_lora_weights.safetensors")
    after = transformer(**inputs)[0]
    after_merged = diffusers.GlmImagePipeline.from_pretrained(merged_dir).transformer.eval()(**inputs)[0]
  (lora,) = transformer.peft_config.values()
  assert (lora.r, lora.lora_alpha) == (4, 8.0)
  assert (after - before).abs().max() > 1e-6  # two decoder updates moved the adapters off B = 0
  np.testing.assert_allclose(after_merged.numpy(), after.numpy(), rtol=0, atol=1e-4)


def _nft(converted):
  """The decoupled recipe with DiffusionNFT on the decoder (the moving average as its old policy, kept and
  checkpointed) beside GRPO on the generator."""
  _, ckpt = converted
  return ("--config=configs/glm_image_t2i_decoupled.py:tiny", f"--config.model.checkpoint_dir={ckpt}",
          "--config.decoder.algorithm=nft", "--config.decoder.ema.every=1", *DECOUPLED)


@pytest.mark.makes_reference
def test_the_decoupled_nft_recipe_keeps_its_moving_average_on_eight_devices(shared_runs, converted):
  """The generator on-policy at every step (DiffusionNFT has no ratio); the checkpoint of step 2 holds each policy's
  trained state and the decoder's moving average."""
  single = _single(shared_runs, converted, _nft)
  rows = _rows(single)
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r["ar/first_iter/ratio/min"] == r["ar/first_iter/ratio/max"] == 1.0 for r in rows)
  assert {"params", "opt_state", "decoder_params", "decoder_opt_state", "decoder_ema"} <= set(
      os.listdir(single / "checkpoints" / "2"))


@pytest.mark.xdist_group("pod")
def test_decoupled_nft_run_trains_as_two_processes(converted, shared_runs, tmp_path):
  multi, _ = _pod(tmp_path, shared_runs, converted, _nft)
  assert "decoder_ema" in os.listdir(multi / "checkpoints" / "2")


def test_the_hps_recipe_trains_on_both_preference_rewards_and_its_evaluation_reports_them(shared_runs, tmp_path):
  """configs/glm_image_t2i_lora.py:hps,tiny trained on HPS v2.1 and ImageReward (tiny folders made by open_clip and
  transformers' BLIP, converted by the command line: tests/rewards/preference_models.py), then --mode=eval on
  PartiPrompts: each report column holds its reward's scores of the images the evaluation saved. (The recipe's
  own HPS entry, filled by the flags its docstring gives, is refused without them: tests/test_main.py.)"""
  from PIL import Image

  from glmrl.rewards import RewardComposer
  from tests.rewards import preference_models

  hps, image_reward = preference_models.hps(shared_runs), preference_models.image_reward(shared_runs)
  entries = ({"name": "hps", "weight": 1.0, "kwargs": {"ckpt_dir": str(hps / "converted"),
                                                        "tokenizer_dir": str(hps / "tokenizer")}},
             {"name": "image_reward", "weight": 1.0, "kwargs": {"ckpt_dir": str(image_reward / "converted"),
                                                                 "tokenizer_dir": str(image_reward / "bert")}})
  workdir = tmp_path / "run"
  recipe = ("--config=configs/glm_image_t2i_lora.py:hps,tiny", "--config.train.num_steps=2",
            "--config.checkpoint.save_interval=2")
  completed(*recipe, f"--config.rewards={entries!r}", tmp_path=workdir)  # main.py's __main__, in this process
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r["reward/hps/std"] > 0 and r["reward/image_reward/std"] > 0 for r in rows)
  np.testing.assert_allclose([r["reward/mean"] for r in rows],
                             [r["reward/hps/mean"] + r["reward/image_reward/mean"] for r in rows], rtol=1e-5)

  completed(*recipe, "--mode=eval", "--config.eval.benchmark=parti:2", "--config.eval.steps=0,2",
            f"--config.rewards={entries!r}", tmp_path=workdir)
  report = json.loads((workdir / "eval" / "report.json").read_text())
  composer = RewardComposer(list(entries))
  prompts = report["prompt_text"]
  for step in ("0", "2"):  # the first sample of each prompt, saved as eval/images/STEP/PROMPT.png
    images = np.stack([np.asarray(Image.open(workdir / "eval" / "images" / step / f"{i}.png").convert("RGB"))
                       for i in range(len(prompts))])
    _, scores = composer(images, prompts)
    for name in ("hps", "image_reward"):
      np.testing.assert_allclose(report["first_sample"][f"reward/{name}"][step], scores[name], rtol=1e-5, atol=1e-6,
                                 err_msg=f"{name} at step {step}")
