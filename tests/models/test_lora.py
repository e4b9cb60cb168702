"""LoRA adapters (glmrl.models.lora): adapter math vs a float64 numpy oracle, exactness at init and with
adapters off, merged export, parameter paths and shardings, abstract full-size build.

Tolerances (float32): adapter forward and gradients vs float64 numpy 1e-5 relative to the largest
reference magnitude; merged-kernel logits vs the adapted forward 1e-5 relative likewise. Init and
adapters-off AR logits are compared bit for bit (np.array_equal); the DiT at init to 1e-5 relative
(see test_dit_targets_and_base_function_at_init).
"""

import glmrl  # noqa: F401  (first: disables flax eager sharding)

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from glmrl import sharding
from glmrl.errors import UserError
from glmrl.models import glm_image
from glmrl.models import lora
from glmrl.models.ar.config import ARConfig
from glmrl.models.ar.model import GlmImageAR
from glmrl.models.ar.text import StackedLinear
from glmrl.models.glm_image import preset_configs
from glmrl.models.lora import LoraConfig, LoraParam

REL_TOL = 1e-5
TINY = preset_configs("tiny")
# Rank 64 on q/k/v/o and gate/up/down of the released decoder's 40 layers (E=4096, I=13696,
# 32 query and 2 kv heads of 128; gate/up one fused adapter): 40 * 64 * (2*(E+4096) + 2*(E+256) + (E+2I) + (I+E)).
FULL_RANK64_PARAMS = 190_382_080


def rel_err(got, want) -> float:
  want = np.asarray(want, np.float64)
  return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def path_str(path) -> str:
  return ".".join(str(k) for k in path)


def flat(state) -> dict:
  return {path_str(p): v for p, v in nnx.to_flat_state(state)}


class Holder(nnx.Module):
  """One nnx.Linear (with bias) and one StackedLinear, as the models build them."""

  def __init__(self, d_in: int, d_out: int, *, rngs: nnx.Rngs):
    cfg = ARConfig.tiny()
    self.proj = nnx.Linear(d_in, d_out, use_bias=True, dtype=jnp.float32, rngs=rngs,
                           kernel_metadata={"out_sharding": (sharding.EMBED, sharding.HEADS)})
    self.stack = StackedLinear(cfg, d_in, 2, d_out, (sharding.EMBED, sharding.MLP), use_bias=True, rngs=rngs)
    self.other = nnx.Linear(d_in, d_out, rngs=rngs)


def randomize_b(model: nnx.Module, seed: int, std: float) -> None:
  """Stands in for trained adapters: every lora_b drawn N(0, std^2)."""
  rng = np.random.default_rng(seed)
  for path, variable in nnx.to_flat_state(nnx.state(model, LoraParam)):
    if path[-1] == "lora_b":
      variable[...] = jnp.asarray(rng.normal(0, std, variable.shape), variable.dtype)


# ----------------------------------------------------------------------------------------- adapter math


def test_adapter_math_and_gradients_vs_numpy():
  d_in, d_out, rank, alpha = 24, 20, 4, 6.0
  model = lora.apply_lora(Holder(d_in, d_out, rngs=nnx.Rngs(0)), LoraConfig(rank, alpha, (r"^proj$", r"stack")),
                          nnx.Rngs(1))
  assert isinstance(model.proj, lora.LoraLinear) and isinstance(model.stack, lora.LoraStackedLinear)
  assert type(model.other) is nnx.Linear
  randomize_b(model, seed=2, std=0.5)
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 3, d_in)).astype(np.float32)
  cot_lin = rng.standard_normal((2, 3, d_out)).astype(np.float32)
  cot_stack = rng.standard_normal((2, 3, 2, d_out)).astype(np.float32)
  s = alpha / rank

  p = {k: np.asarray(v[...], np.float64) for k, v in flat(nnx.state(model)).items()}
  x64 = x.astype(np.float64)
  a, b = p["proj.lora_a"], p["proj.lora_b"]
  want_lin = x64 @ p["proj.kernel"] + p["proj.bias"] + s * (x64 @ a) @ b
  sa, sb = p["stack.lora_a"], p["stack.lora_b"]  # [I, R], [R, J, O]: one adapter of the fused map
  want_stack = (np.einsum("nmi,iso->nmso", x64, p["stack.kernel"]) + p["stack.bias"]
                + s * np.einsum("nmr,rso->nmso", x64 @ sa, sb))
  # loss = <y_lin, cot_lin> + <y_stack, cot_stack>: dB = s (xA)^T G, dA = s x^T (G B^T) (B^T over members too).
  x2 = x64.reshape(-1, d_in)
  g_lin, g_stack = cot_lin.reshape(-1, d_out).astype(np.float64), cot_stack.reshape(-1, 2, d_out).astype(np.float64)
  want_grads = {
      "proj.lora_a": s * x2.T @ (g_lin @ b.T),
      "proj.lora_b": s * (x2 @ a).T @ g_lin,
      "stack.lora_a": s * x2.T @ np.einsum("nso,rso->nr", g_stack, sb),
      "stack.lora_b": s * np.einsum("nr,nso->rso", x2 @ sa, g_stack),
  }

  graphdef, adapters, rest = nnx.split(model, LoraParam, ...)

  @jax.jit
  def loss_and_outputs(adapters):
    m = nnx.merge(graphdef, adapters, rest)
    y_lin, y_stack = m.proj(x), m.stack(x)
    return jnp.sum(y_lin * cot_lin) + jnp.sum(y_stack * cot_stack), (y_lin, y_stack)

  grads, (y_lin, y_stack) = jax.grad(loss_and_outputs, has_aux=True)(adapters)
  assert rel_err(y_lin, want_lin) < REL_TOL
  assert rel_err(y_stack, want_stack) < REL_TOL
  got_grads = flat(grads)
  assert set(got_grads) == set(want_grads)  # gradients w.r.t. the adapters only
  for name, want in want_grads.items():
    assert got_grads[name].shape == want.shape, name
    assert rel_err(got_grads[name][...], want) < REL_TOL, name


def test_flattened_adapters_keep_the_batch_split_on_8_chips():
  """Compiled for v5e-8 from this host (libtpu, fsdp 8): the adapted layers' outputs keep the batch split over
  the chips and the program all-gathers nothing: flattening [B, L, I] to [B*L, I] inside the adapter moves no
  activation between chips (only the adapters' gradients are summed over them)."""
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  from glmrl.programs import topology  # pylint: disable=import-outside-toplevel  (libtpu: requirements-compile.txt)

  devices = topology.devices(topology.parse("v5e-8"))
  mesh = jax.sharding.Mesh(np.array(devices).reshape(1, 8, 1), ("data", "fsdp", "tensor"))
  model = nnx.eval_shape(lambda: lora.apply_lora(Holder(24, 20, rngs=nnx.Rngs(0)), LoraConfig(4, 8.0, ("proj",
                                                                                               "stack")), nnx.Rngs(1)))
  graphdef, adapters, rest = nnx.split(model, LoraParam, ...)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  place = lambda tree: jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated), tree)
  x = jax.ShapeDtypeStruct((16, 3, 24), jnp.float32, sharding=jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(sharding.BATCH_AXES)))

  def loss(adapters, rest, x_BxLxI):
    m = nnx.merge(graphdef, adapters, rest)
    y_lin, y_stack = m.proj(x_BxLxI), m.stack(x_BxLxI)
    return jnp.sum(y_lin ** 2) + jnp.sum(y_stack ** 2), (y_lin, y_stack)

  with sharding.use_mesh(mesh):  # the activations' batch constraints, as a run traces its programs
    compiled = jax.jit(jax.grad(loss, has_aux=True)).lower(place(adapters), place(rest), x).compile()
  _, (y_lin, y_stack) = compiled.output_shardings
  for y in (y_lin, y_stack):
    assert y.spec[0] in (sharding.BATCH_AXES, "fsdp", ("fsdp",)), y.spec
  assert "all-gather" not in compiled.as_text()


def test_adapter_shapes_shardings_and_init():
  d_in, d_out, rank = 64, 48, 8
  model = lora.apply_lora(Holder(d_in, d_out, rngs=nnx.Rngs(0)), LoraConfig(rank, 16.0, (r"^proj$", r"^stack$")),
                          nnx.Rngs(1))
  p = flat(nnx.state(model, LoraParam))
  assert p["proj.lora_a"].shape == (d_in, rank) and p["proj.lora_b"].shape == (rank, d_out)
  assert p["stack.lora_a"].shape == (d_in, rank) and p["stack.lora_b"].shape == (rank, 2, d_out)
  names = {k: v.get_metadata()["out_sharding"] for k, v in p.items()}
  assert names == {"proj.lora_a": ("embed", None), "proj.lora_b": (None, "heads"),
                   "stack.lora_a": ("embed", None), "stack.lora_b": (None, None, "mlp")}
  assert p["proj.lora_b"].get_metadata()["lora_scale"] == 2.0
  # PEFT's kaiming_uniform(a=sqrt(5)): U(-1/sqrt(I), 1/sqrt(I)); B zero.
  for name in ("proj.lora_a", "stack.lora_a"):
    a = np.asarray(p[name][...])
    assert np.abs(a).max() <= 1 / np.sqrt(d_in) and np.abs(a).max() > 0.8 / np.sqrt(d_in)
    assert abs(a.std() - 1 / np.sqrt(3 * d_in)) < 0.1 / np.sqrt(3 * d_in)
  assert not np.any(np.asarray(p["proj.lora_b"][...])) and not np.any(np.asarray(p["stack.lora_b"][...]))


def test_config_and_target_errors():
  with pytest.raises(UserError, match="alpha"):
    LoraConfig(rank=8)
  with pytest.raises(UserError, match="rank=-1"):
    LoraConfig(rank=-1)
  with pytest.raises(UserError, match="not a valid regex"):
    LoraConfig(4, 4.0, ("attn.(q",))
  with pytest.raises(UserError, match="non-empty tuple"):
    LoraConfig(4, 4.0, "proj")
  with pytest.raises(UserError, match=r"'\^nothing\$' matches no linear layer"):
    lora.apply_lora(Holder(8, 8, rngs=nnx.Rngs(0)), LoraConfig(2, 2.0, (r"^proj$", r"^nothing$")), nnx.Rngs(1))
  model = lora.apply_lora(Holder(8, 8, rngs=nnx.Rngs(0)), LoraConfig(2, 2.0, (r"^proj$",)), nnx.Rngs(1))
  with pytest.raises(UserError, match="proj already has lora adapters"):
    lora.apply_lora(model, LoraConfig(2, 2.0, (r"^proj$",)), nnx.Rngs(1))
  # rank 0: no adapters, the model untouched.
  plain = Holder(8, 8, rngs=nnx.Rngs(0))
  assert lora.apply_lora(plain, LoraConfig(), nnx.Rngs(1)) is plain
  assert lora.count_lora_params(plain) == 0 and type(plain.proj) is nnx.Linear


# --------------------------------------------------------------------------------------- tiny AR model


@pytest.fixture(scope="module")
def ar_models():
  """(base, adapted at init): the adapted model shares the base weights."""
  base = nnx.merge(*glm_image.build("ar", TINY.ar))  # GlmImageAR(TINY.ar, rngs=nnx.Rngs(0))'s, jitted
  adapted = lora.apply_lora(nnx.clone(base), LoraConfig(4, 8.0, lora.AR_TARGETS), nnx.Rngs(1))
  return base, adapted


@pytest.fixture(scope="module")
def ar_inputs():
  b, l = 2, 7
  t = TINY.ar.text
  ids = np.random.default_rng(0).integers(0, t.vocab_size, (b, l))
  positions = np.broadcast_to(np.arange(l), (3, b, l))
  valid = np.ones((b, l), bool)
  valid[1, :2] = False  # left padding in row 1
  return jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(valid)


@pytest.fixture(scope="module")
def logits():
  return nnx.jit(lambda model, ids, positions, valid: model(ids, positions, valid))


def ar_target_paths(cfg) -> set:
  layers = range(cfg.text.num_hidden_layers)
  return ({f"text.layers.{i}.attn.{n}" for i in layers for n in "qkvo"}
          | {f"text.layers.{i}.mlp.{n}" for i in layers for n in ("gate_up", "down")})


def test_ar_at_init_equals_base_exactly(ar_models, ar_inputs, logits):
  base, adapted = ar_models
  want = np.asarray(logits(base, *ar_inputs))
  got = np.asarray(logits(adapted, *ar_inputs))
  assert np.array_equal(got, want)


def test_ar_param_paths(ar_models):
  base, adapted = ar_models
  base_paths = set(flat(nnx.state(base, nnx.Param)))
  assert set(flat(nnx.state(adapted, lora.BASE_PARAMS))) == base_paths
  assert "text.layers.0.attn.q.kernel" in base_paths and "text.layers.0.mlp.gate_up.kernel" in base_paths
  adapter_paths = set(flat(nnx.state(adapted, LoraParam)))
  assert adapter_paths == {f"{m}.{w}" for m in ar_target_paths(TINY.ar) for w in ("lora_a", "lora_b")}
  # The whole state (not only Params) differs by the adapters alone.
  assert set(flat(nnx.state(adapted))) == set(flat(nnx.state(base))) | adapter_paths
  # Adapters live in graphdef + state: a round trip through split / merge keeps them.
  graphdef, state = nnx.split(adapted)
  assert isinstance(nnx.merge(graphdef, state).text.layers[1].mlp.gate_up, lora.LoraStackedLinear)


def test_ar_adapters_off_and_merge(ar_models, ar_inputs, logits):
  base, adapted = ar_models
  trained = nnx.clone(adapted)
  randomize_b(trained, seed=4, std=0.05)
  want_base = np.asarray(logits(base, *ar_inputs))
  got_trained = np.asarray(logits(trained, *ar_inputs))
  assert rel_err(got_trained, want_base) > 1e-3  # the adapters matter (else the checks below prove nothing)

  graphdef, state = nnx.split(trained)
  off = lora.adapters_off(state)
  assert np.array_equal(np.asarray(logits(nnx.merge(graphdef, off), *ar_inputs)), want_base)
  assert set(flat(off)) == set(flat(state))
  # adapters_off leaves lora_a alone: switching adapters back on needs no copy of it.
  assert np.array_equal(flat(off)["text.layers.0.attn.q.lora_a"][...],
                        flat(state)["text.layers.0.attn.q.lora_a"][...])

  base_graphdef, base_state = nnx.split(base)
  merged = lora.merge_lora(state)
  assert set(flat(merged)) == set(flat(base_state))
  got_merged = np.asarray(logits(nnx.merge(base_graphdef, merged), *ar_inputs))
  assert rel_err(got_merged, got_trained) < REL_TOL
  # Kernels without adapters (lm_head, vision) pass through unchanged.
  assert np.array_equal(flat(merged)["lm_head.kernel"][...], flat(base_state)["lm_head.kernel"][...])


def test_ar_grad_over_adapters_only(ar_models, ar_inputs):
  _, adapted = ar_models
  graphdef, adapters, rest = nnx.split(adapted, LoraParam, ...)

  @jax.jit
  def grad(adapters):
    return jax.grad(lambda a: jnp.mean(nnx.merge(graphdef, a, rest)(*ar_inputs) ** 2))(adapters)

  grads = flat(grad(adapters))
  assert set(grads) == set(flat(adapters))
  # At init (B = 0) A gets no gradient, B does: dB = s (xA)^T G, dA = s x^T G B^T.
  assert all(not np.any(np.asarray(v[...])) for k, v in grads.items() if k.endswith("lora_a"))
  assert all(np.any(np.asarray(v[...])) for k, v in grads.items() if k.endswith("lora_b"))


def test_ar_grad_under_remat(ar_models, ar_inputs):
  """Adapters under nnx.remat (cfg.remat) give the gradients of the plain forward.

  The frozen base weights sit inside the remat'd layers; nnx.remat writes its state back, which
  flax refuses for Variables made outside the grad trace, so the model is merged with copy=True
  (fresh Variables at this trace level, no array copies).
  """
  _, adapted = ar_models
  trained = nnx.clone(adapted)
  randomize_b(trained, seed=7, std=0.05)  # so that A gets a gradient too
  graphdef, adapters, frozen = nnx.split(trained, LoraParam, ...)
  remat_model = nnx.eval_shape(lambda: lora.apply_lora(
      GlmImageAR(dataclasses.replace(TINY.ar, remat=True), rngs=nnx.Rngs(0)), LoraConfig(4, 8.0, lora.AR_TARGETS),
      nnx.Rngs(1)))
  remat_graphdef = nnx.split(remat_model, LoraParam, ...)[0]

  def grads(graphdef):
    @jax.jit
    def run(adapters, frozen):
      def loss(a):
        return jnp.mean(nnx.merge(graphdef, a, frozen, copy=True)(*ar_inputs) ** 2)
      return jax.grad(loss)(adapters)
    return flat(run(adapters, frozen))

  plain, remat = grads(graphdef), grads(remat_graphdef)
  assert set(plain) == set(remat)
  for name in plain:
    assert rel_err(remat[name][...], plain[name][...]) < REL_TOL, name


def test_ar_jitted_init_onto_shardings():
  """The project's build path: abstract model, shardings from logical names, one jitted init."""
  cfg = LoraConfig(4, 4.0, lora.AR_TARGETS)

  def build():
    return lora.apply_lora(GlmImageAR(TINY.ar, rngs=nnx.Rngs(0)), cfg, nnx.Rngs(1))

  graphdef, abstract = nnx.split(nnx.eval_shape(build))
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  shardings = sharding.state_shardings(abstract, mesh)
  state = jax.jit(lambda: nnx.split(build())[1], out_shardings=shardings)()
  q = flat(state)
  assert q["text.layers.0.attn.q.lora_a"].shape == (TINY.ar.text.hidden_size, 4)
  assert not np.any(np.asarray(q["text.layers.0.attn.q.lora_b"][...]))
  assert lora.count_lora_params(state) == lora.count_lora_params(abstract) > 0


# ------------------------------------------------------------------------------------------ tiny DiT


def test_dit_targets_and_base_function_at_init():
  cfg = TINY.dit
  base = nnx.merge(*glm_image.build("dit", cfg))  # GlmImageDiT(cfg, rngs=nnx.Rngs(0))'s, jitted
  adapted = lora.apply_lora(nnx.clone(base), LoraConfig(4, 4.0, lora.DIT_TARGETS), nnx.Rngs(1))
  blocks = range(len(adapted.blocks))
  want_paths = ({f"blocks.{i}.attn.{n}" for i in blocks for n in ("q", "k", "v", "out")}
                | {f"blocks.{i}.mlp.{n}" for i in blocks for n in ("fc1", "fc2")})
  assert set(flat(nnx.state(adapted, LoraParam))) == {f"{m}.{w}" for m in want_paths for w in ("lora_a", "lora_b")}
  assert set(flat(nnx.state(adapted, lora.BASE_PARAMS))) == set(flat(nnx.state(base, nnx.Param)))

  rng = np.random.default_rng(5)
  b, h, w = 2, 4, 4
  grid = (h // cfg.patch_size) * (w // cfg.patch_size)
  args = (jnp.asarray(rng.standard_normal((b, cfg.in_channels, h, w)), jnp.float32),
          jnp.asarray(rng.integers(0, cfg.prior_vq_quantizer_codebook_size, (b, grid))),
          jnp.asarray(rng.standard_normal((b, 3, cfg.text_embed_dim)), jnp.float32),
          jnp.asarray([500.0, 20.0]), jnp.asarray([[h * 8, w * 8]] * b, jnp.float32), jnp.zeros((b, 2), jnp.float32))
  forward = nnx.jit(lambda model, *a: model(*a))
  want = np.asarray(forward(base, *args))
  # Not bit for bit: each adapted layer's zero delta is exact (the blocks alone match bit for bit), but
  # on CPU the extra add on the last block's fc2 changes the loop fusion that feeds its output into
  # norm_out's LayerNorm reduction, and that fused code rounds differently (~1e-7 relative).
  assert rel_err(forward(adapted, *args), want) < REL_TOL
  randomize_b(adapted, seed=6, std=0.05)
  assert rel_err(forward(adapted, *args), want) > 1e-3


# ------------------------------------------------------------------------------------- full-size AR


def test_full_ar_rank64_abstract():
  """The released AR sizes with rank-64 adapters, built abstractly as a run builds them (the abstract base of
  `glm_image.abstract_model`, adapters attached under eval_shape: glmrl/policy/state.py): shapes only, nothing
  allocated."""
  full = preset_configs("full").ar
  graphdef, abstract = glm_image.abstract_model("ar", full)
  model = nnx.eval_shape(lambda s: lora.apply_lora(nnx.merge(graphdef, s), LoraConfig(64, 64.0, lora.AR_TARGETS),
                                                   nnx.Rngs(1)), abstract)
  _, state = nnx.split(model)
  leaves = jax.tree.leaves(state)
  assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
  t = full.text
  e, i, q, kv = t.hidden_size, t.intermediate_size, t.num_attention_heads * t.head_dim, \
      t.num_key_value_heads * t.head_dim
  per_layer = 64 * ((e + q) + 2 * (e + kv) + (q + e) + (e + 2 * i) + (i + e))
  count = lora.count_lora_params(model)
  print(f"full AR, rank 64 on {lora.AR_TARGETS}: {count:,} LoRA parameters")
  assert count == t.num_hidden_layers * per_layer == FULL_RANK64_PARAMS
  p = flat(nnx.state(model, LoraParam))
  assert p["text.layers.39.mlp.gate_up.lora_b"].shape == (64, 2, i)

  class FakeMesh:  # a 64-chip layout, for the logical -> mesh mapping only
    shape = {"data": 1, "fsdp": 8, "tensor": 8}

  specs = {k: tuple(sharding.logical_to_spec(v.get_metadata()["out_sharding"], v.shape, FakeMesh()))
           for k, v in p.items() if k.startswith("text.layers.0.")}
  assert specs["text.layers.0.attn.q.lora_a"] == ("fsdp", None)
  assert specs["text.layers.0.attn.q.lora_b"] == (None, "tensor")
  assert specs["text.layers.0.attn.o.lora_a"] == ("tensor", None)
  assert specs["text.layers.0.mlp.gate_up.lora_a"] == ("fsdp", None)
  assert specs["text.layers.0.mlp.gate_up.lora_b"] == (None, None, "tensor")
  assert specs["text.layers.0.mlp.down.lora_b"] == (None, "fsdp")
