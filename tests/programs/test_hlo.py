"""What a program moves between chips and to and from HBM, read from optimized HLO: hand-written modules with
hand-computed bytes; a decode loop compiled for a v5e slice, whose HBM bytes per token are its weights and cache
and agree with XLA's own count; the tiny sampler, whose decode loop gathers FSDP-sharded weights every token and
none when the weights are replicated."""

import os

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import glmrl  # noqa: F401,E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from glmrl.programs import hlo  # noqa: E402
from glmrl.programs import compile_mode as mode_lib  # noqa: E402
from glmrl.programs import abstract  # noqa: E402
from glmrl.programs import report  # noqa: E402
from glmrl.programs import topology  # noqa: E402
from tests.train.common import tiny_config  # noqa: E402

MODULE = """HloModule jit_step, entry_computation_layout={()->f32[]}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%gather_start (p: bf16[16,64]) -> bf16[64,64] {
  %p = bf16[16,64]{1,0} parameter(0)
  ROOT %all-gather.1 = bf16[64,64]{1,0:T(8,128)(2,1)} all-gather(%p), channel_id=3, replica_groups=[2,4]<=[8], dimensions={0}
}

%gather_done (p: bf16[16,64]) -> bf16[64,64] {
  %p = bf16[16,64]{1,0} parameter(0)
  ROOT %all-gather.2 = bf16[64,64]{1,0} all-gather(%p), channel_id=3, replica_groups=[2,4]<=[8], dimensions={0}
}

%inner_body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]) parameter(0)
  %v = f32[8]{0} get-tuple-element(%t), index=1
  %cp = f32[8]{0} collective-permute(%v), channel_id=9, source_target_pairs={{0,1},{1,0}}
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %r = (s32[], f32[8]) tuple(%i, %cp)
}

%inner_cond (t: (s32[], f32[8])) -> pred[] {
  %t = (s32[], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(99)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (t: (s32[], bf16[16,64], f32[32])) -> (s32[], bf16[16,64], f32[32]) {
  %t = (s32[], bf16[16,64], f32[32]) parameter(0)
  %w = bf16[16,64]{1,0} get-tuple-element(%t), index=1
  %start = bf16[64,64]{1,0} fusion(%w), kind=kCustom, calls=%gather_start
  %done = bf16[64,64]{1,0} fusion(%w), kind=kCustom, calls=%gather_done
  %g = f32[32]{0} get-tuple-element(%t), index=2
  %rs = f32[8]{0} reduce-scatter(%g), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, to_apply=%add
  %z = f32[8]{0} constant({0,0,0,0,0,0,0,0})
  %zero = s32[] constant(0)
  %it = (s32[], f32[8]) tuple(%zero, %z)
  %inner = (s32[], f32[8]) while(%it), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %r = (s32[], bf16[16,64], f32[32]) tuple(%i, %w, %g)
}

%cond (t: (s32[], bf16[16,64], f32[32])) -> pred[] {
  %t = (s32[], bf16[16,64], f32[32]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[]{:T(128)} constant(10)
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[1024], w: bf16[16,64], g: f32[32]) -> f32[] {
  %a = f32[1024]{0} parameter(0)
  %ar = f32[1024]{0} all-reduce(%a), channel_id=1, replica_groups=mesh['x'=4,'y'=2] {'x'}, to_apply=%add
  %w = bf16[16,64]{1,0} parameter(1)
  %g = f32[32]{0} parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[16,64], f32[32]) tuple(%zero, %w, %g)
  %loop = (s32[], bf16[16,64], f32[32]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[] constant(0)
}
"""


def test_hand_written_module_bytes():
  traffic = hlo.analyse(MODULE, devices=8)[0]
  # Outside: the all-reduce of 4 KiB over groups of 4 ('x'): 2 x 4096 x 3/4.
  assert traffic.outside == 2 * 4096 * 3 / 4
  loop, = traffic.loops
  assert loop.trip_count == 10  # counter < 10 from 0
  # Per iteration: one all-gather (its start and done share channel 3) of 64 x 64 bf16 over groups of 4,
  # a reduce-scatter to 8 f32 over groups of 4, and 3 trips of a permute of 8 f32.
  gather, scatter, permute = 64 * 64 * 2 * 3 / 4, 8 * 4 * 3, 3 * 8 * 4
  assert loop.bytes_per_iteration == gather + scatter + permute
  assert loop.collectives_per_iteration == {"all-gather": 1, "reduce-scatter": 1, "collective-permute": 3}
  assert traffic.total == traffic.outside + 10 * loop.bytes_per_iteration


DECODE_MODULE = """HloModule jit_decode, entry_computation_layout={()->f32[1024]}

%slice_layer (p0: bf16[4,256,256]) -> bf16[256,256] {
  %p0 = bf16[4,256,256]{2,1,0} parameter(0)
  %s = bf16[1,256,256]{2,1,0} slice(%p0), slice={[1:2], [0:256], [0:256]}
  ROOT %b = bf16[256,256]{1,0} bitcast(%s)
}

%layer (w: bf16[4,256,256], x: bf16[8,256]) -> bf16[8,256] {
  %w = bf16[4,256,256]{2,1,0} parameter(0)
  %x = bf16[8,256]{1,0:T(8,128)S(1)} parameter(1)
  %wl = bf16[256,256]{1,0} fusion(%w), kind=kLoop, calls=%slice_layer
  ROOT %d = bf16[8,256]{1,0} dot(%x, %wl), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%pass (p: bf16[4,256,256]) -> bf16[4,256,256] {
  %p = bf16[4,256,256]{2,1,0} parameter(0)
  ROOT %v = bf16[4,256,256]{2,1,0} bitcast(%p)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%whole (w: bf16[4,256,256]) -> f32[] {
  %w = bf16[4,256,256]{2,1,0} parameter(0)
  %v = bf16[4,256,256]{2,1,0} fusion(%w), kind=kLoop, calls=%pass
  %f = f32[4,256,256]{2,1,0} convert(%v)
  %zero = f32[] constant(0)
  ROOT %r = f32[] reduce(%f, %zero), dimensions={0,1,2}, to_apply=%add
}

%update (c: bf16[64,256], u: bf16[1,256], i: s32[]) -> bf16[64,256] {
  %c = bf16[64,256]{1,0} parameter(0)
  %u = bf16[1,256]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = bf16[64,256]{1,0} dynamic-update-slice(%c, %u, %i, %z)
}

%body (t: (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256])) -> (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256]) {
  %t = (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %w = bf16[4,256,256]{2,1,0} get-tuple-element(%t), index=1
  %x = bf16[8,256]{1,0:T(8,128)S(1)} get-tuple-element(%t), index=2
  %c = bf16[64,256]{1,0} get-tuple-element(%t), index=3
  %u = bf16[1,256]{1,0} get-tuple-element(%t), index=4
  %h = bf16[8,256]{1,0} fusion(%w, %x), kind=kOutput, calls=%layer
  %c2 = bf16[64,256]{1,0} fusion(%c, %u, %i), kind=kLoop, calls=%update
  %zero = s32[] constant(0)
  %c3 = bf16[64,256]{1,0} dynamic-update-slice(%c2, %u, %i, %zero)
  %all = f32[] fusion(%w), kind=kLoop, calls=%whole
  %s16 = bf16[16,64]{1,0} slice(%c), slice={[0:16], [0:64]}
  %ag = (bf16[16,64]{1,0}, bf16[64,64]{1,0}, u32[]{:S(2)}) all-gather-start(%s16), channel_id=5, replica_groups=[2,4]<=[8], dimensions={0}
  %agd = bf16[64,64]{1,0} all-gather-done(%ag)
  ROOT %r = (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256]) tuple(%i, %w, %h, %c3, %u)
}

%cond (t: (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256])) -> pred[] {
  %t = (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(10)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[1024], t: (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256])) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %t = (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256]) parameter(1)
  %loop = (s32[], bf16[4,256,256], bf16[8,256], bf16[64,256], bf16[1,256]) while(%t), condition=%cond, body=%body
  ROOT %cp = f32[1024]{0} copy(%a)
}
"""


def test_hand_written_module_hbm_bytes():
  memory = hlo.analyse(DECODE_MODULE, devices=8)[1]
  assert memory.outside == 2 * 1024 * 4  # the copy: read and written
  loop, = memory.loops
  layer = 256 * 256 * 2 + 8 * 256 * 2  # one layer sliced out of 4 (nested fusion, bitcast); x in VMEM; h written
  update = 256 * 2 + 4 + 256 * 2  # the cache updated in place: u and i read, u's bytes written
  dus = 2 * 256 * 2  # an unfused in-place update: u read and written
  whole = 4 * 256 * 256 * 2 + 4  # passed through a nested fusion and reduced: all 4 layers read
  sliced = 2 * 16 * 64 * 2  # read and written
  gather = 16 * 64 * 2 + 64 * 64 * 2  # the start reads its operand and writes its result; the done moves nothing
  assert loop.trip_count == 10 and loop.bytes_per_iteration == layer + update + dus + whole + sliced + gather
  assert memory.total == memory.outside + 10 * loop.bytes_per_iteration


def test_a_compiled_decode_loop_reads_one_tokens_weights_and_cache_per_iteration():
  """A 4-layer decode loop with a KV-style cache, compiled for v5e-8: per iteration the model counts the weights
  (each layer sliced out of the stacked array) and the cache rows of this chip, within 1%; its body once plus the
  code outside agrees with XLA's `bytes accessed` within 3%."""
  mesh = jax.sharding.Mesh(np.array(topology.devices(topology.parse("v5e-8"))), ("data",))
  layers, width, tokens, batch = 4, 1024, 64, 8

  def decode(w_LxExE, x_BxE, cache_LxBxTxE):
    def body(i, carry):
      h_BxE, cache = carry
      for l in range(layers):
        h_BxE = jnp.tanh(h_BxE @ w_LxExE[l])
        cache = cache.at[l, :, i].set(h_BxE)
        h_BxE = h_BxE + jnp.einsum("bte,be->be", cache[l], h_BxE) * 1e-3
      return h_BxE, cache
    return jax.lax.fori_loop(0, tokens, body, (x_BxE, cache_LxBxTxE))

  spec = lambda *s: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*s))
  args = (jax.ShapeDtypeStruct((layers, width, width), jnp.bfloat16, sharding=spec()),
          jax.ShapeDtypeStruct((batch, width), jnp.bfloat16, sharding=spec("data")),
          jax.ShapeDtypeStruct((layers, batch, tokens, width), jnp.bfloat16, sharding=spec(None, "data")))
  compiled, text = mode_lib.compile_with_text(jax.jit(decode, donate_argnums=2).lower(*args))
  memory = hlo.analyse(text, 8)[1]
  loop = memory.main_loop()
  assert loop.trip_count == tokens
  weights, cache = layers * width * width * 2, layers * (batch // 8) * tokens * width * 2
  assert weights + cache <= loop.bytes_per_iteration <= 1.01 * (weights + cache)
  assert memory.outside + loop.bytes_per_iteration == pytest.approx(report.xla_bytes_accessed(compiled), rel=0.03)


def test_the_main_loop_is_the_one_that_moves_the_most_bytes_not_the_most_iterations():
  """A decoder's shape: 10 heavy steps (each reads a 2 MiB weight), then 16 light bands (a 64 KiB slice each)."""
  def program(w_ExE, x_BxE):
    steps = jax.lax.fori_loop(0, 10, lambda i, h: jnp.tanh(h @ w_ExE), x_BxE)
    bands = jax.lax.fori_loop(0, 16, lambda i, a: a + jax.lax.dynamic_slice_in_dim(steps, i * 2, 2, 0).sum(), 0.0)
    return steps, bands

  device = topology.devices(topology.parse("v5e-8"))[:1]
  sharding = jax.sharding.SingleDeviceSharding(device[0])
  args = (jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=sharding),
          jax.ShapeDtypeStruct((32, 1024), jnp.bfloat16, sharding=sharding))
  _, text = mode_lib.compile_with_text(jax.jit(program).lower(*args))
  memory = hlo.analyse(text, 1)[1]
  assert sorted(l.trip_count for l in memory.loops) == [10, 16]
  assert memory.main_loop().trip_count == 10


@pytest.mark.parametrize("text,devices,n", [
    ("replica_groups={{0,1,2,3,4,5}}", 8, 6), ("replica_groups=[4,2]<=[8]", 8, 2),
    ("replica_groups=mesh['data'=2,'fsdp'=4,'tensor'=2] {'fsdp','tensor'}", 16, 8), ("replica_groups={}", 8, 8)])
def test_group_sizes(text, devices, n):
  assert hlo.group_size(text, devices) == n


@pytest.mark.parametrize("text,groups,crosses", [
    # XLA:GPU's mesh groups over a permuted device list (FSDP over each node's 8 GPUs of two nodes, data across).
    ("replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_0'}, dimensions={0}",
     [list(range(8)), list(range(8, 16))], False),
    ("replica_groups=mesh['axis_0'=16,'axis_1'=1] {'axis_0'}, use_global_device_ids=true", [list(range(16))], True),
    ("replica_groups=[8,2]<=[2,8]T(1,0), to_apply=%add", [[i, i + 8] for i in range(8)], True),
    ("replica_groups=[2,8]<=[16]", [list(range(8)), list(range(8, 16))], False),
    ("replica_groups={{0,1,2,3},{8,9,10,11}}", [[0, 1, 2, 3], [8, 9, 10, 11]], False),
    ("source_target_pairs={{0,1},{7,8}}, channel_id=3", [[0, 1], [7, 8]], True)])
def test_replica_groups_and_whether_they_cross_nodes(text, groups, crosses):
  assert hlo.groups(text, 16) == groups
  assert hlo.crosses_nodes(text, 16, devices_per_node=8) is crosses
  assert hlo.crosses_nodes(text, 16, devices_per_node=None) is False


def test_a_roofline_charges_the_network_for_the_bytes_that_cross_nodes():
  """Of 1 GB a GPU receives per iteration, 0.25 GB from other nodes: 0.75 GB over NVLink (450 GB/s) plus 0.25 GB
  over the network (50 GB/s) = 6.67 ms per iteration, the bound of 10 iterations."""
  chip = topology.parse("h100-16").chip
  entry = {"calls_per_step": 1, "collective_bytes_total": 10e9, "network_bytes_total": 2.5e9, "hbm_bytes_total": 1e9,
           "main_loop": {"trip_count": 10, "collective_bytes_per_iteration": 1e9, "network_bytes_per_iteration": 0.25e9,
                         "hbm_bytes_per_iteration": 0.1e9}}
  seconds, bound = report.roofline(entry, chip, 16)
  assert bound == "links" and seconds == pytest.approx(10 * (0.75e9 / 450e9 + 0.25e9 / 50e9))
  entry.pop("network_bytes_total"), entry["main_loop"].pop("network_bytes_per_iteration")
  assert report.roofline(entry, chip, 16)[0] == pytest.approx(10 * 1e9 / 450e9)


def program_traffic(builder=abstract.sampler, ar_weights="update", **mesh):
  config = tiny_config(data__prompts_per_step=4, rollout__ar_weights=ar_weights,
                       **{f"mesh__{k}": v for k, v in mesh.items()})
  run = abstract.build(config, mode_lib._mesh(config, topology.devices(topology.parse("v5e-8"))))  # pylint: disable=protected-access
  with jax.set_mesh(run.mesh):
    program = builder(run)
  lowered = program.lowered
  if isinstance(lowered, tuple):  # consecutive parts (the reshard): the tiny generator's is one
    (lowered,) = lowered
  _, text = mode_lib.compile_with_text(lowered)
  return hlo.analyse(text, 8)[0], run



def test_the_decode_loop_gathers_sharded_weights_every_token_and_nothing_when_replicated():
  sharded, run = program_traffic(data=1, fsdp=8)
  replicated, _ = program_traffic(data=8, fsdp=1)
  tokens = run.layout.num_new_tokens
  for traffic in (sharded, replicated):
    assert traffic.main_loop().trip_count == tokens - 1  # the first token comes from the prefill
  assert sharded.main_loop().collectives_per_iteration.get("all-gather", 0) > 0
  assert sharded.main_loop().bytes_per_iteration > 0
  assert replicated.main_loop().collectives_per_iteration.get("all-gather", 0) == 0
  assert replicated.main_loop().bytes_per_iteration < sharded.main_loop().bytes_per_iteration / 10


def test_gathered_rollout_layout_moves_the_generator_once_per_rollout_not_per_token():
  """config.rollout.ar_weights="gathered" on fsdp 8: the decode loop gathers nothing; the reshard program moves
  each fsdp-split state 7/8 of its bytes per chip (about), once."""
  sampler, run = program_traffic(ar_weights="gathered", data=1, fsdp=8)
  assert sampler.main_loop().trip_count == run.layout.num_new_tokens - 1
  assert sampler.main_loop().collectives_per_iteration.get("all-gather", 0) == 0
  reshard, _ = program_traffic(abstract.ar_reshard, ar_weights="gathered", data=1, fsdp=8)
  _, states = run.component("ar")
  split = [x for x in jax.tree.leaves(states) if "fsdp" in str(x.sharding.spec)]
  want = sum(x.size * x.dtype.itemsize for x in split) * 7 / 8
  assert split and reshard.loops == []
  # XLA gathers the norms' small vectors as one all-reduce of zero-padded copies, twice a gather's bytes in the
  # ring model: 0.6% more here.
  assert want <= reshard.total <= 1.02 * want


def test_auto_attention_compiles_the_splash_kernel_into_the_tpu_decoder():
  """model.dit_attention="auto" in --mode=compile: the DiT's attention is Pallas' Mosaic kernel in the TPU program
  (XLA's kernel has none)."""
  texts = {}
  for impl in ("xla", "auto"):
    config = tiny_config(data__prompts_per_step=4, model__dit_attention=impl)
    run = abstract.build(config, mode_lib._mesh(config, topology.devices(topology.parse("v5e-8"))))  # pylint: disable=protected-access
    with jax.set_mesh(run.mesh):
      program = abstract.decoder(run)
    texts[impl] = mode_lib.compile_with_text(program.lowered)[1]
  kernel = 'custom_call_target="tpu_custom_call"'
  assert kernel in texts["auto"] and kernel not in texts["xla"]
