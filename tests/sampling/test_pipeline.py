"""The JAX pipeline: image-to-image against diffusers' GlmImagePipeline, an i2i smoke run, input errors.

Parity (float32, tiny random models, DiT and VAE ported from the torch reference): from the same
initial latents, target-grid prior tokens, glyph embeddings, condition images and condition-image
prior token ids, the denoised latents match within 1e-4 and the decoded uint8 images within 1 level.
"""

import glmrl  # noqa: F401

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from diffusers import AutoencoderKL as TorchVAE
from diffusers import FlowMatchEulerDiscreteScheduler, GlmImageTransformer2DModel
from diffusers import GlmImagePipeline as TorchPipeline
from flax import nnx
from PIL import Image
from transformers import ByT5Tokenizer

from checkpoints_convert.maps import ar as ar_map
from checkpoints_convert.maps import dit as dit_map
from checkpoints_convert.maps import glyph as glyph_map
from checkpoints_convert.maps import vae as vae_map
from glmrl.models import glm_image
from glmrl.models.ar import image_processing
from glmrl.models.ar.model import GlmImageAR
from glmrl.models.ar.tokenizer import word_processor
from glmrl.models.dit import GlmImageDiT
from glmrl.models.glyph.t5 import T5Encoder
from glmrl.models.vae import AutoencoderKL
from glmrl.sampling import decode
from glmrl.sampling import pipeline as pipeline_lib
from glmrl.sampling.pipeline import GlmImagePipeline, PipelineSpec, check_decode_batch, decode_chunk
from tests import torch_port

H = W = 64
STEPS = 3
GUIDANCE = 1.5
GROUP = 2
# No quoted text: the prompts' glyph embeddings have the negative (empty) prompt's length, as the
# reference requires of embeddings passed in (the t2i decode test covers distinct glyph texts).
PROMPTS = ("a sign says hello", "a red house with a tree")
WORDS = PROMPTS + ("a blue cat",)


def _images(seed, prompts=len(PROMPTS), per_prompt=2):
  return np.random.default_rng(seed).integers(0, 256, (prompts, per_prompt, H, W, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def setup():
  torch.manual_seed(0)
  configs = glm_image.preset_configs("tiny")
  t_dit = GlmImageTransformer2DModel.from_config(configs.dit.to_hf()).eval()
  t_vae = TorchVAE(**{k: v for k, v in configs.vae.to_hf().items() if not k.startswith("_")}).eval()
  with torch.no_grad():  # zero-initialised projections would hide most of the network
    for p in t_dit.parameters():
      p.add_(0.05 * torch.randn_like(p))
  ref = TorchPipeline(tokenizer=None, processor=None, text_encoder=None, vision_language_encoder=None, vae=t_vae,
                      transformer=t_dit, scheduler=FlowMatchEulerDiscreteScheduler.from_config(
                          configs.scheduler.to_hf()))
  # Random AR and glyph weights too, ported from torch: quicker than initialising ours on CPU.
  t_ar = transformers.GlmImageForConditionalGeneration(transformers.GlmImageConfig(**configs.ar.to_hf())).eval()
  t_glyph = transformers.T5EncoderModel(transformers.T5Config(**configs.glyph.to_hf())).eval()
  models = {
      "ar": nnx.split(torch_port.port(t_ar, GlmImageAR, configs.ar, ar_map.RULES)),
      "glyph": nnx.split(torch_port.port(t_glyph, T5Encoder, configs.glyph, glyph_map.RULES)),
      "dit": nnx.split(torch_port.port(t_dit, GlmImageDiT, configs.dit, dit_map.RULES)),
      "vae": nnx.split(torch_port.port(t_vae, AutoencoderKL, configs.vae, vae_map.RULES)),
  }
  spec = PipelineSpec(height=H, width=W, dit_steps=STEPS, guidance_scale=GUIDANCE, share_noise_in_group=False,
                      prompt_pad=64, glyph_pad=8)
  pipe = GlmImagePipeline(configs, models, word_processor(configs.ar, configs.image_processor, WORDS),
                          ByT5Tokenizer(), spec)
  return ref, pipe


def _unpadded(embeds_BxSxD, mask_BxS):
  rows = [np.asarray(e)[np.asarray(m)] for e, m in zip(embeds_BxSxD, mask_BxS)]
  assert len({r.shape for r in rows}) == 1, [r.shape for r in rows]
  return torch.from_numpy(np.stack(rows))


def test_image_to_image_matches_reference_pipeline(setup):
  ref, pipe = setup
  sources = _images(0)
  prepared = pipe.prepare(PROMPTS, sources)
  p, n = sources.shape[:2]
  b = p * GROUP
  assert prepared.source_ids.shape == (p, n, H // 32, W // 32)

  rng = np.random.default_rng(1)
  latents = rng.normal(size=(b, pipe.configs.dit.in_channels, H // 8, W // 8)).astype(np.float32)
  target = rng.integers(0, pipe.configs.ar.vq.num_embeddings, size=(b, H // 32, W // 32)).astype(np.int32)
  images, out_latents = pipe.decode_tokens(prepared, jnp.asarray(target), jnp.asarray(latents), GROUP,
                                           pipe.source_cache(prepared))

  # The reference runs one row per sample (num_images_per_prompt=1): it takes the negative glyph
  # embeddings as given, without repeating them per image, so each row is its own "prompt" here,
  # with its prompt's condition images written into its own cache slot.
  glyph, mask, neg, neg_mask = pipe.glyph_embeddings(prepared, GROUP)
  row_prompt = np.repeat(np.arange(p), GROUP)
  src_prior = np.asarray(decode.upsample_prior_tokens(
      jnp.asarray(prepared.source_ids).reshape(p * n, H // 32, W // 32))).reshape(p, n, -1)
  kw = dict(
      image=[[Image.fromarray(im) for im in sources[i]] for i in row_prompt],
      prompt_embeds=_unpadded(glyph, mask), negative_prompt_embeds=_unpadded(neg, neg_mask),
      prior_token_ids=torch.from_numpy(np.array(decode.upsample_prior_tokens(jnp.asarray(target)))).long(),
      prior_token_image_ids=[torch.from_numpy(src_prior[i].reshape(-1)).long() for i in row_prompt],
      source_image_grid_thw=[torch.tensor([[1, H // 16, W // 16]] * n) for _ in row_prompt],
      latents=torch.from_numpy(latents), height=H, width=W, num_inference_steps=STEPS, guidance_scale=GUIDANCE)
  final = {}

  def keep_latents(pipeline, step, timestep, tensors):
    final["latents"] = tensors["latents"].numpy().copy()
    return {}

  with torch.no_grad():
    ref_images = ref(output_type="pt", callback_on_step_end=keep_latents, **kw).images.numpy()  # [B, 3, H, W]
    t2i_latents = ref(output_type="latent", **{**kw, "image": None, "prior_token_image_ids": None,
                                               "source_image_grid_thw": None}).images.numpy()
  ref_latents = final["latents"]

  assert np.abs(ref_latents - latents).max() > 0.1  # the DiT moved the latents
  assert np.abs(ref_latents - t2i_latents).max() > 1e-2  # and the condition images' cache matters
  np.testing.assert_allclose(np.asarray(out_latents), ref_latents, atol=1e-4)
  assert images.dtype == jnp.uint8 and images.shape == (b, H, W, 3)
  ref_uint8 = np.round(np.transpose(ref_images, (0, 2, 3, 1)) * 255)
  assert np.abs(np.asarray(images, np.int32) - ref_uint8).max() <= 1


def test_image_to_image_smoke(setup):
  """The whole pipeline with our AR model sampling the target tokens."""
  _, pipe = setup
  sources = _images(2)
  key = jax.random.key(0)
  out = pipe(PROMPTS, key, samples_per_prompt=GROUP, source_images=sources)
  b = len(PROMPTS) * GROUP
  assert out.images.shape == (b, H, W, 3) and out.images.dtype == jnp.uint8
  assert out.sample.target.shape == (b, H // 32, W // 32) and out.sample.preview is None
  assert np.all((np.asarray(out.sample.target) >= 0) &
                (np.asarray(out.sample.target) < pipe.configs.ar.vq.num_embeddings))
  assert np.isfinite(np.asarray(out.latents)).all()

  # The condition images' tokens come from the AR model's vision encoder + VQ, image by image.
  prepared = pipe.prepare(PROMPTS, sources)
  pixels, grid = image_processing.preprocess(list(sources[1]), pipe.processor.image_cfg)
  ids = np.asarray(pipe.ar_model().image_tokens(pixels, grid)).reshape(2, H // 32, W // 32)
  np.testing.assert_array_equal(prepared.source_ids[1], ids)

  # Other condition images, same key: other tokens and images.
  other = pipe(PROMPTS, key, samples_per_prompt=GROUP, source_images=_images(3))
  assert not np.array_equal(np.asarray(other.images), np.asarray(out.images))


# ---------------------------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def bare():
  """A pipeline without models: a check that comes after any model work would fail differently."""
  configs = glm_image.preset_configs("tiny")
  spec = PipelineSpec(height=H, width=W, dit_steps=STEPS)
  return GlmImagePipeline(configs, {}, word_processor(configs.ar, configs.image_processor, WORDS),
                          ByT5Tokenizer(), spec)


@pytest.mark.parametrize("size", [(48, 64), (64, 100), (0, 64)])
def test_spec_sizes_must_be_multiples_of_32(size):
  with pytest.raises(ValueError, match=rf"{'height' if size[0] % 32 or not size[0] else 'width'}="):
    PipelineSpec(height=size[0], width=size[1])


@pytest.mark.parametrize("prompts, match", [
    (["a cat", ""], r"prompt 1 is ''"),
    (["  "], r"prompt 0 is '  '"),
    ([], "empty"),
    ("a cat", "single string"),
])
def test_prompts_need_text(bare, prompts, match):
  with pytest.raises(ValueError, match=match):
    bare.prepare(prompts)


def _one(size=(H, W), dtype=np.uint8, channels=3):
  return np.zeros((*size, channels), dtype)


@pytest.mark.parametrize("sources, match", [
    ([[_one(dtype=np.float32)], [_one()]], r"condition image 0 of prompt 0 is float32"),
    ([[_one()], [_one(channels=4)]], r"condition image 0 of prompt 1 is uint8 \(64, 64, 4\)"),
    ([[_one()], [Image.new("L", (W, H))]], r"PIL mode 'L'"),
    ([[_one()], [_one((64, 96))]], r"is 64x96 but the run generates 64x64"),
    ([[_one()], [_one((64, 80))]], r"is 64x80; its sides must be multiples of 32"),
    ([[_one()], [_one(), _one()]], r"same number .* got \[1, 2\]"),
    ([[_one()], []], r"same number .* got \[1, 0\]"),
    ([[_one()]], r"1 condition-image lists for 2 prompts"),
])
def test_condition_image_errors(bare, sources, match):
  with pytest.raises(ValueError, match=match):
    bare.prepare(["a cat", "a dog"], sources)


def test_condition_grid_must_match_target_grid(bare):
  """An AR processor that would tokenize condition images onto another grid than the decoder's."""
  fine = dataclasses.replace(bare.processor.image_cfg, patch_size=4)
  processor = word_processor(bare.configs.ar, fine, WORDS)
  pipe = GlmImagePipeline(bare.configs, {}, processor, ByT5Tokenizer(), bare.spec)
  with pytest.raises(ValueError, match=r"into a 8x8 grid, but image-to-image needs the 2x2 grid"):
    pipe.prepare(["a cat"], [[_one()]])


@pytest.mark.parametrize("preset, sizes", [("tiny", ((64, 64), (32, 128), (256, 96))),
                                           ("full", ((1024, 1024), (768, 1344), (2048, 2048)))])
def test_preset_condition_grid_lines_up(preset, sizes):
  configs = glm_image.preset_configs(preset)
  cfg = configs.image_processor
  assert cfg.patch_size == configs.ar.vision.patch_size and cfg.merge_size == cfg.temporal_patch_size == 1
  for h, w in sizes:
    rh, rw = image_processing.smart_resize(h, w, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    assert (rh // cfg.patch_size, rw // cfg.patch_size) == (h // 32, w // 32)


# ---------------------------------------------------------------------------------------- glyph shapes


def test_glyph_lengths_never_recompile_the_decoder(setup):
  """Prompts with quoted texts of different lengths and counts run on one compiled denoise+decode program."""
  _, pipe = setup
  spec = dataclasses.replace(pipe.spec, glyph_pad=32, glyph_texts=3)
  fixed = GlmImagePipeline(pipe.configs, pipe.models, pipe.processor, pipe.glyph_tokenizer, spec)
  batches = [("a sign says 'hi'", "a red house"), ("a sign says 'hello there'", "a 'cat' and a 'dog' say 'hi'"),
             ("a tree", "a blue cat"), ("'a' 'b' 'c'", "'d' 'e'")]
  glyph_fn = pipeline_lib._encode_glyph  # pylint: disable=protected-access  # its compiled programs
  compiled, lengths = [], []
  for i, prompts in enumerate(batches):
    out = fixed(prompts, jax.random.key(i), samples_per_prompt=1)
    assert out.images.shape == (2, H, W, 3)
    lengths.append(tuple(fixed.prepare(prompts).glyph.lengths))
    compiled.append((decode.denoise_and_decode._cache_size(), glyph_fn._cache_size()))
  assert len(set(lengths)) == 4  # the batches really differ in glyph lengths (and in numbers of texts)
  assert len(set(compiled)) == 1, compiled  # nothing compiled after the first batch


@pytest.mark.parametrize("prompt, match", [
    ("a sign says 'hello there, how are you'", r"prompt 0: its quoted texts take \d+ glyph tokens, more than "
                                               r"config.data.max_glyph_tokens=8"),
    ("'a' 'b' 'c' 'd' 'e'", r"prompt 0: 5 quoted texts, more than config.data.max_glyph_texts=4 \(found 'a', 'b', "
                            r"'c', 'd', \.\.\.; GLM-Image draws every span"),
    # Two apostrophes quote a span, as in the released pipeline; the message shows it.
    ("the cat's hat and the dog's bone", r"prompt 0: its quoted texts take \d+ glyph tokens, more than "
                                         r"config.data.max_glyph_tokens=8 \(found 's hat and the dog'; .*apostrophes"),
])
def test_glyph_text_beyond_the_fixed_size_is_an_error(bare, prompt, match):
  spec = dataclasses.replace(bare.spec, glyph_pad=8, glyph_texts=4)
  pipe = GlmImagePipeline(bare.configs, {}, bare.processor, ByT5Tokenizer(), spec)
  with pytest.raises(ValueError, match=match):
    pipe.prepare([prompt])


def test_a_glyph_refusal_names_the_value_that_fits_every_prompt():
  """Of several prompts, the first that does not fit is named with how many do not, and the value given fits them
  all: the check passes at it and fails one below."""
  from glmrl.sampling.pipeline import check_glyph_fits
  prompts = [("a sign 'hi'", "p.txt:1"), ("a sign 'hello there, how are you'", "p.txt:2"),
             ("a poster 'hello there'", "p.txt:3"), ("no text", "p.txt:4")]
  with pytest.raises(ValueError) as e:
    check_glyph_fits(prompts, ByT5Tokenizer(), 8, 4)
  message = str(e.value)
  assert message.startswith("p.txt:2: its quoted texts take ") and "; 2 of 4 prompts exceed it; " in message
  fits = int(message.rsplit("--config.data.max_glyph_tokens=", 1)[1].split()[0])
  check_glyph_fits(prompts, ByT5Tokenizer(), fits, 4)
  with pytest.raises(ValueError, match=f"--config.data.max_glyph_tokens={fits} fits them all"):
    check_glyph_fits(prompts, ByT5Tokenizer(), fits - 1, 4)


@pytest.mark.parametrize("chunk", [1, GROUP])
def test_decode_in_chunks_equals_the_whole_batch(setup, chunk):
  """Image-to-image (so each chunk must read its prompts' condition-image slots): chunks of one sample and
  of one group give the whole batch's latents (1e-5, float32; batch sizes change XLA's blocking) and images
  (within 1 uint8 level)."""
  _, pipe = setup
  sources = _images(0)
  prepared = pipe.prepare(PROMPTS, sources)
  b = len(PROMPTS) * GROUP
  rng = np.random.default_rng(2)
  latents = jnp.asarray(rng.normal(size=(b, pipe.configs.dit.in_channels, H // 8, W // 8)).astype(np.float32))
  target = jnp.asarray(rng.integers(0, pipe.configs.ar.vq.num_embeddings, size=(b, H // 32, W // 32)), jnp.int32)
  cache = pipe.source_cache(prepared)
  whole_images, whole_latents = pipe.decode_tokens(prepared, target, latents, GROUP, cache)
  chunked = GlmImagePipeline(pipe.configs, pipe.models, pipe.processor, pipe.glyph_tokenizer,
                             dataclasses.replace(pipe.spec, decode_batch=chunk))
  images, out_latents = chunked.decode_tokens(prepared, target, latents, GROUP, cache)
  np.testing.assert_allclose(np.asarray(out_latents), np.asarray(whole_latents), atol=1e-5)
  assert np.abs(np.asarray(images, np.int32) - np.asarray(whole_images, np.int32)).max() <= 1


@pytest.mark.parametrize("batch,group,devices,chunk", [
    (128, 16, 32, 32), (128, 16, 128, 128), (128, 16, 4, 4), (128, 16, 1, 1),  # one sample per device
    (128, 16, 24, 128),  # no chunk splits over 24 devices: the whole batch
    (32, 8, 16, 16), (8, 4, 1, 1), (8, 4, 8, 8)])
def test_decode_batch_0_picks_one_sample_per_device(batch, group, devices, chunk):
  assert decode_chunk(0, batch, group, devices) == chunk
  check_decode_batch(chunk, batch, group)
  assert decode_chunk(16, 128, 16, 4) == 16  # a set chunk is kept
  assert decode_chunk(-1, 128, 16, 4) == 128  # -1: the whole batch
  with pytest.raises(ValueError, match="decode_batch=12 must divide the batch of 128"):
    decode_chunk(12, 128, 16, 4)


def test_decode_batch_must_fit_the_groups(setup):
  _, pipe = setup
  chunked = GlmImagePipeline(pipe.configs, pipe.models, pipe.processor, pipe.glyph_tokenizer,
                             dataclasses.replace(pipe.spec, decode_batch=3))
  prepared = pipe.prepare(PROMPTS)
  target = jnp.zeros((4, H // 32, W // 32), jnp.int32)
  with pytest.raises(ValueError, match="decode_batch=3 must divide the batch of 4 samples"):
    chunked.decode_tokens(prepared, target, jnp.zeros((4, pipe.configs.dit.in_channels, H // 8, W // 8)), GROUP)
