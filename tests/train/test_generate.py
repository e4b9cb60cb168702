"""`--mode=generate` end to end on the tiny demo config (called as a function, not a subprocess)."""

import os

import glmrl  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from configs import demo
from glmrl.programs import plan
from glmrl.checkpoint import TrainCheckpointer
from glmrl.checkpoint import manager as checkpoint_manager
from glmrl.models.ar.model import GlmImageAR
from glmrl.train import generate as generate_lib

PROMPTS = ("a red apple", "a lighthouse at dusk", "a sign that says \"OPEN\"")
GROUP = 2
STEP = 5


def _config(prompts_file):
  c = demo.get_config()
  c.data.prompts_file = str(prompts_file)
  c.data.prompts_per_step = 2  # 3 prompts: the second batch is padded with the first prompt
  c.grpo.group_size = GROUP
  c.sampling.dit_steps = 2
  return c


def _zero_ar_params(config):
  """The whole AR state of the run's config with every parameter 0: uniform next-token logits."""
  cfg = plan.model_configs(config).ar
  _, state = nnx.split(nnx.eval_shape(lambda: GlmImageAR(cfg, rngs=nnx.Rngs(0))))
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), state)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
  root = tmp_path_factory.mktemp("generate")
  prompts_file = root / "prompts.txt"
  prompts_file.write_text("\n".join(PROMPTS) + "\n")
  config = _config(prompts_file)
  workdir = root / "work"
  ckpt = TrainCheckpointer(str(workdir), save_interval=1, max_to_keep=1)
  ckpt.save(STEP, {"params": _zero_ar_params(config), "opt_state": {"count": jnp.zeros((), jnp.int32)}},
            jax.random.key(0), {"step": STEP}, force=True)
  ckpt.close()
  result = generate_lib.generate(config, str(workdir))
  return config, workdir, result


def test_writes_one_png_per_sample_a_grid_and_tokens(generated):
  config, workdir, result = generated
  out = workdir / "generate"
  h, w = config.data.height, config.data.width
  expected = sorted(f"{p}_{s}.png" for p in range(len(PROMPTS)) for s in range(GROUP))
  assert sorted(x.name for x in out.glob("*_*.png")) == expected
  assert sorted(result["pngs"]) == sorted(str(out / name) for name in expected)
  for name in expected:
    with Image.open(out / name) as im:
      assert im.mode == "RGB" and im.size == (w, h)
  with Image.open(out / "grid.png") as grid:
    assert grid.mode == "RGB" and grid.width > GROUP * w and grid.height > len(PROMPTS) * h

  tokens = np.load(out / "tokens.npz")
  n = len(PROMPTS) * GROUP
  assert list(tokens["prompts"]) == list(PROMPTS)
  np.testing.assert_array_equal(tokens["prompt_index"], np.repeat(np.arange(len(PROMPTS)), GROUP))
  np.testing.assert_array_equal(tokens["sample_index"], np.tile(np.arange(GROUP), len(PROMPTS)))
  assert tokens["target"].shape == (n, h // 32, w // 32)
  # Text-to-image: the 16x16 preview grid, the target grid, then the end token.
  assert tokens["tokens"].shape == (n, 16 * 16 + (h // 32) * (w // 32) + 1)
  np.testing.assert_array_equal(tokens["tokens"][:, 256:-1].reshape(tokens["target"].shape), tokens["target"])
  assert int(tokens["step"]) == STEP


def test_uses_the_checkpoint_parameters(generated):
  """All-zero AR parameters make every grid token uniform over the codebook."""
  _, workdir, result = generated
  assert result["step"] == STEP
  tokens = np.load(workdir / "generate" / "tokens.npz")
  codebook = plan.model_configs(generated[0]).ar.vq.num_embeddings
  np.testing.assert_allclose(tokens["logprobs"][:, :-1], -np.log(codebook), atol=1e-5)


def test_no_checkpoint_means_initial_model(tmp_path):
  assert checkpoint_manager.restore_trained_params(str(tmp_path), {}) == (None, None)
  (tmp_path / "checkpoints").mkdir()
  assert checkpoint_manager.restore_trained_params(str(tmp_path), {}) == (None, None)


def test_a_second_generate_keeps_the_first_ones_folder(generated, caplog):
  """A later generate into the workdir writes generate_2/ (then generate_3/, ...): the first one's files stay.
  Restoring the step says nothing of Orbax's read-only options ("read_only=True, setting save_interval_steps=0")."""
  config, workdir, _ = generated
  first = {p.name: p.read_bytes() for p in (workdir / "generate").iterdir()}
  with caplog.at_level("INFO"):
    again = generate_lib.generate(config, str(workdir))
  assert "the trained parameters of step 5" in caplog.text  # the restore's own line is captured
  assert "read_only" not in caplog.text and "read only" not in caplog.text, caplog.text
  assert os.path.dirname(again["grid"]) == str(workdir / "generate_2")
  assert {p.name: p.read_bytes() for p in (workdir / "generate").iterdir()} == first
  assert sorted(p.name for p in (workdir / "generate_2").iterdir()) == sorted(first)
  assert generate_lib.output_folder(str(workdir)) == str(workdir / "generate_3")
