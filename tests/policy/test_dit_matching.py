"""The DiffusionNFT and AWM updates on a tiny random DiT with DiT LoRA, float32.

Checked: the gradient accumulated over micro-batches x trained slots equals the gradient of an independently
written whole-batch loss (rtol 1e-4) for both algorithms, with the KL to adapters-off and the moving-average
anchor on; AWM's first update has a ratio of exactly 1 at every slot; NFT against an average equal to the
parameters deviates by rounding alone; CFG-free training (guidance 1.0) runs one DiT pass per velocity.
"""

import glmrl  # noqa: F401

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from glmrl.grpo import flow, matching
from glmrl.models import lora as lora_lib
from glmrl.policy import awm, nft
from glmrl.policy import dit_matching as dm
from glmrl.sampling import decode, scheduler
from tests.policy.tiny_dit import adapted_dit

H = W = 64
STEPS, SLOTS, B = 4, 2, 4
GUIDANCE = 3.0


def spec(algorithm="nft", **kw):
  objective = (nft.NftObjective(nft_beta=0.5, adv_clip_max=5.0) if algorithm == "nft" else
               awm.AwmObjective(clip_range=0.5, adv_clip_max=5.0, weighting="t"))
  base = dict(objective=objective, guidance_scale=GUIDANCE, beta=0.0, ema_beta=0.0, micro_batches=1,
              reference="adapters_off")
  return dm.MatchingSpec(**{**base, **kw})


@pytest.fixture(scope="module")
def setup():
  dit_cfg, graphdef, adapters, base, cond, rng = adapted_dit(B, H, W)
  ema = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(jax.random.key(5), x.shape), adapters)
  sched = scheduler.glm_image_schedule(STEPS, H, W, scheduler.SchedulerConfig.full())
  timesteps, sigmas = dm.draw_slots(jax.random.key(6), jnp.asarray(sched.model_timesteps),
                                    jnp.asarray(sched.sigmas), B, SLOTS)
  rollout = dm.MatchingRollout(
      cond=cond, target_size=jnp.tile(jnp.array([[H, W]], jnp.float32), (B, 1)), crop=jnp.zeros((B, 2)),
      x0=jnp.asarray(rng.normal(size=(B, dit_cfg.in_channels, H // 8, W // 8)), jnp.float32),
      noise_keys=jax.random.split(jax.random.key(7), B), timesteps=timesteps, sigmas=sigmas,
      old_logp=jnp.full((B, SLOTS), jnp.nan), advantages=jnp.array([1.5, -0.5, -1.0, 8.0]),
      mask=jnp.array([[1.0] * SLOTS, [1.0] * SLOTS, [0.0] * SLOTS, [1.0] * SLOTS]))
  return graphdef, adapters, base, ema, rollout


def test_slots_are_distinct_steps_of_the_schedule(setup):
  *_, rollout = setup
  sched = scheduler.glm_image_schedule(STEPS, H, W, scheduler.SchedulerConfig.full())
  for row_t, row_s in zip(np.asarray(rollout.timesteps), np.asarray(rollout.sigmas)):
    idx = [int(np.flatnonzero(sched.model_timesteps == t)[0]) for t in row_t]
    assert len(set(idx)) == SLOTS
    np.testing.assert_array_equal(row_s, sched.sigmas[idx])


def velocity(graphdef, params, base, rollout, x, t, guidance=GUIDANCE):
  dit = nnx.merge(graphdef, params, base, copy=True)
  return decode.guided_velocity(dit, rollout.cond, x, t, guidance, rollout.target_size, rollout.crop)


def direct_loss(adapters, setup, s: dm.MatchingSpec, old_logp=None):
  """The whole batch's loss written out slot by slot from the formulas (not the module's loop)."""
  graphdef, _, base, ema, rollout = setup
  off = lora_lib.adapters_off(adapters)
  total, count = 0.0, 0.0
  for k in range(SLOTS):
    eps = jnp.stack([jax.random.normal(jax.random.fold_in(rollout.noise_keys[b], k), rollout.x0.shape[1:])
                     for b in range(B)])
    sigma = rollout.sigmas[:, k]
    x_t = (1 - sigma)[:, None, None, None] * rollout.x0 + sigma[:, None, None, None] * eps
    t = rollout.timesteps[:, k]
    v = velocity(graphdef, adapters, base, rollout, x_t, t)
    v_ema = jax.lax.stop_gradient(velocity(graphdef, ema, base, rollout, x_t, t))
    v_ref = jax.lax.stop_gradient(velocity(graphdef, off, base, rollout, x_t, t))
    o = s.objective
    if isinstance(o, nft.NftObjective):
      r = matching.optimality(rollout.advantages, o.adv_clip_max)
      term = matching.nft_loss(v, v_ema, rollout.x0, x_t, sigma, r, beta=o.nft_beta, scale=o.adv_clip_max)
    else:
      logp = -sigma * jnp.mean(jnp.square(v - (eps - rollout.x0)), axis=(1, 2, 3))
      ratio = jnp.exp(logp - old_logp[:, k])
      a = jnp.clip(rollout.advantages, -5.0, 5.0)
      term = jnp.maximum(-a * ratio, -a * jnp.clip(ratio, 1 - o.clip_range, 1 + o.clip_range))
    term = term + s.beta * jnp.mean(jnp.square(v - v_ref), axis=(1, 2, 3))
    term = term + s.ema_beta * jnp.mean(jnp.square(v - v_ema), axis=(1, 2, 3))
    total = total + jnp.sum(term * rollout.mask[:, k])
    count = count + jnp.sum(rollout.mask[:, k])
  return total / count


@pytest.mark.parametrize("algorithm", ["nft", "awm"])
def test_accumulated_gradient_equals_the_whole_batch_gradient(setup, algorithm):
  graphdef, adapters, base, ema, rollout = setup
  s = spec(algorithm=algorithm, beta=0.3, ema_beta=0.2)
  old = None
  if algorithm == "awm":  # a later iteration: off-policy old log-probs, so the ratio has a gradient
    old = jnp.asarray(np.random.default_rng(1).normal(size=(B, SLOTS)), jnp.float32) * 1e-3 - 1.0
    rollout = rollout.replace(old_logp=old)
  data = (graphdef, adapters, base, ema, rollout)
  anchors = dm.Anchors(None, ema)
  want = jax.grad(direct_loss)(adapters, data, s, old)
  # Two micro-batches x two slots against the whole batch written at once.
  grads_sum, stats, _ = dm.accumulate_gradients(graphdef, adapters, base, rollout, anchors, False,
                                                spec=dataclasses.replace(s, micro_batches=2))
  for g, w in zip(jax.tree.leaves(grads_sum), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g) / float(stats["denominator"]), np.asarray(w), rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(float(stats["numerator"] / stats["denominator"]),
                             float(direct_loss(adapters, data, s, old)), rtol=1e-5)


def test_awm_first_update_ratio_is_exactly_one(setup):
  graphdef, adapters, base, ema, rollout = setup
  tx = optax.adam(1e-3)
  _, _, metrics, old = dm.update(graphdef, adapters, base, tx.init(adapters), rollout, dm.Anchors(None, ema), True,
                                 spec=spec(algorithm="awm"), tx=tx, schedule=lambda _: 1e-3)
  assert float(metrics["ratio/min"]) == float(metrics["ratio/max"]) == 1.0
  assert float(metrics["skipped"]) == 0.0 and old.shape == (B, SLOTS) and np.all(np.isfinite(np.asarray(old)))


def test_nft_against_its_own_parameters_has_no_deviation_and_updates(setup):
  graphdef, adapters, base, _, rollout = setup
  tx = optax.adam(1e-3)
  new, _, metrics, old = dm.update(graphdef, adapters, base, tx.init(adapters), rollout,
                                   dm.Anchors(None, adapters), True, spec=spec(), tx=tx, schedule=lambda _: 1e-3)
  assert old is None and "ratio/min" not in metrics
  # The trained and the old velocity come from two programs (one differentiated): equal up to XLA's fusion
  # rounding, mean squared difference < 1e-10 against velocities of order 1.
  assert float(metrics["old_deviation"]) < 1e-10 and float(metrics["grad_norm"]) > 0
  assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(adapters)))


def test_cfg_free_velocity_is_one_conditional_pass(setup):
  graphdef, adapters, base, _, rollout = setup
  x, t = rollout.x0, rollout.timesteps[:, 0]
  dit = nnx.merge(graphdef, adapters, base)
  calls = []
  original = type(dit).__call__

  def counting(self, *a, **kw):
    calls.append(1)
    return original(self, *a, **kw)

  type(dit).__call__ = counting
  try:
    v1 = decode.guided_velocity(dit, rollout.cond, x, t, 1.0, rollout.target_size, rollout.crop)
    assert len(calls) == 1
    # A traced 1.0 takes the two-branch formula v_u + 1 (v_c - v_u).
    both = jax.jit(lambda g: decode.guided_velocity(dit, rollout.cond, x, t, g, rollout.target_size,
                                                    rollout.crop))(1.0)
    assert len(calls) == 3
  finally:
    type(dit).__call__ = original
  np.testing.assert_allclose(np.asarray(v1), np.asarray(both), rtol=1e-5, atol=1e-6)


def test_cps_window_logprobs_are_the_learners():
  """The sampler's CPS steps and the learner's recomputation (`flow.step_mean`) agree exactly (ratio 1)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 4, 8, 8)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(2, 4, 8, 8)), jnp.float32)
  eps = jnp.asarray(rng.normal(size=(2, 4, 8, 8)), jnp.float32)
  x_next, logp = flow.sde_step(x, v, 0.8, 0.6, 0.8, eps, sde_type="cps")
  again = flow.sde_logprob(x_next, *flow.step_mean("cps", x, v, 0.8, 0.6, 0.8))
  np.testing.assert_array_equal(np.asarray(logp), np.asarray(again))


def test_dgpo_weights_its_groups_as_the_float64_formula_and_accumulates_exactly(setup):
  """DGPO's group weights at the update's parameters against the float64 formula of DGPO's own lines (Luo-Yihong/
  DGPO scripts/train_sd3_dgpo.py 162-193: sigmoid(sum_g A_i beta delta_i / G), delta = error - reference error),
  from errors recomputed here (rows 0-1 and 2-3 are the groups); then its accumulated gradient equals the whole
  batch's of sum w A error + beta KL (rtol 1e-4): over two micro-batches x two slots (the weights' pass first), and
  over one x two (the weights made in the gradient's pass, from its own forward and the reference's velocity)."""
  from glmrl.policy import dgpo

  graphdef, adapters, base, ema, rollout = setup
  s = dm.MatchingSpec(objective=dgpo.DgpoObjective(beta_dpo=50.0, adv_clip_max=5.0, group_size=2),
                      guidance_scale=GUIDANCE, beta=0.3, ema_beta=0.0, micro_batches=1, reference="adapters_off")
  off = lora_lib.adapters_off(adapters)
  errors = {}
  for k in range(SLOTS):
    x_t, target, _, t = dm.slot_inputs(rollout, k)
    for name, p in (("policy", adapters), ("reference", off)):
      v = np.asarray(velocity(graphdef, p, base, rollout, x_t, t), np.float64)
      errors[name, k] = np.mean((v - np.asarray(target, np.float64)) ** 2, axis=(1, 2, 3))
  adv = np.clip(np.asarray(rollout.advantages, np.float64), -5.0, 5.0)
  want = np.zeros((B, SLOTS))
  for k in range(SLOTS):
    delta = errors["policy", k] - errors["reference", k]
    for g in (0, 2):
      s_g = sum(adv[i] * 50.0 * delta[i] / 2 for i in (g, g + 1))
      want[g:g + 2, k] = 1.0 / (1.0 + math.exp(-s_g))
  got, reference_v = dgpo.group_weights(graphdef, adapters, base, rollout, dm.Anchors(None, None), spec=s)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4)
  # The reference's velocities of the weights' pass, kept for the KL (one reference pass per trained step).
  assert reference_v.shape == (B, SLOTS, *rollout.x0.shape[1:])
  for k in range(SLOTS):
    x_t, _, _, t = dm.slot_inputs(rollout, k)
    want_v = velocity(graphdef, off, base, rollout, x_t, t)  # eagerly, where the update's scan fuses its own
    np.testing.assert_allclose(np.asarray(reference_v[:, k]), np.asarray(want_v), rtol=1e-4, atol=1e-6)
  assert dgpo.group_weights(graphdef, adapters, base, rollout, dm.Anchors(None, None),
                            spec=dataclasses.replace(s, beta=0.0))[1] is None  # no KL: none kept
  assert np.ptp(want) > 1e-3  # the groups weigh differently (the check can fail)

  weights = jnp.asarray(want, jnp.float32)

  def whole_batch(params):
    total = count = 0.0
    for k in range(SLOTS):
      x_t, target, _, t = dm.slot_inputs(rollout, k)
      v = velocity(graphdef, params, base, rollout, x_t, t)
      v_ref = jax.lax.stop_gradient(velocity(graphdef, off, base, rollout, x_t, t))
      term = weights[:, k] * jnp.clip(rollout.advantages, -5.0, 5.0) * jnp.mean(jnp.square(v - target), (1, 2, 3))
      term = term + 0.3 * jnp.mean(jnp.square(v - v_ref), axis=(1, 2, 3))
      total, count = total + jnp.sum(term * rollout.mask[:, k]), count + jnp.sum(rollout.mask[:, k])
    return total / count

  want_grads = jax.tree.leaves(jax.grad(whole_batch)(adapters))
  for micro_batches in (2, 1):
    grads_sum, stats, _ = dgpo.accumulate_gradients(graphdef, adapters, base, rollout, dm.Anchors(None, None), True,
                                                    spec=dataclasses.replace(s, micro_batches=micro_batches))
    for g, w in zip(jax.tree.leaves(grads_sum), want_grads):
      np.testing.assert_allclose(np.asarray(g) / float(stats["denominator"]), np.asarray(w), rtol=1e-4, atol=1e-7)
    kept = np.asarray(want)[np.asarray(rollout.mask) > 0].mean()  # the weights' masked mean, as reported
    np.testing.assert_allclose(float(stats["group_weight_mean"]) / float(stats["denominator"]), kept, rtol=1e-4)


def dgpo_clip_dsm_loss_torch(model_v, old_v, ref_v, target_v, advantages, adv_clip_max, clip_range, beta_dpo, group_size):
  """DGPO's loss of one trained step with clip_dsm, in torch as its lines run it (Luo-Yihong/DGPO @ 01ceb4b,
  scripts/train_sd3_dgpo.py 1126-1143 and 162-193; one process: the all-reduced group sums are the local ones)."""
  import torch  # pylint: disable=import-outside-toplevel

  b = model_v.shape[0]
  advantages = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
  dsm_loss = 1 * (target_v - model_v).square().reshape(b, -1).mean(dim=1)
  old_dsm_loss = 1 * (target_v - old_v).square().reshape(b, -1).mean(dim=1)
  ratio = torch.exp(-dsm_loss + old_dsm_loss)
  should_clip = torch.where(advantages > 0, ratio > 1.0 + clip_range, ratio < 1.0 - clip_range)
  dsm_loss = torch.where(should_clip, dsm_loss.detach(), dsm_loss)
  with torch.no_grad():
    ref_dsm_loss = (target_v - ref_v).square().reshape(b, -1).mean(dim=1)
  delta_diff = dsm_loss.detach() - ref_dsm_loss.detach()
  per_sample_term = advantages * beta_dpo * delta_diff / group_size
  groups = torch.arange(b) // group_size
  sums = torch.zeros(b // group_size, dtype=per_sample_term.dtype).scatter_add_(0, groups, per_sample_term)
  weights = torch.sigmoid(sums)[groups]
  return (weights.detach() * advantages * dsm_loss).mean(), should_clip


def test_dgpo_clip_dsm_takes_the_gradient_of_dgpos_own_lines():
  """decoder.dgpo_clip_dsm: the slot loss's gradient in the velocity, with the group weights of
  `matching.dgpo_group_weights`, equals torch's autograd through DGPO's lines (float64 there, float32 here, rtol
  1e-5), on 8 images in 2 groups whose moving-average errors put some past each side of the clip; without the clip
  the clipped images' gradients differ."""
  import torch  # pylint: disable=import-outside-toplevel

  from glmrl.policy import dgpo

  rng = np.random.default_rng(0)
  b, shape, clip = 8, (2, 3, 3), 0.05
  target, v = rng.normal(size=(b, *shape)), rng.normal(size=(b, *shape))
  ref = v + 0.3 * rng.normal(size=(b, *shape))
  # The average's velocity: its error moves each image's ratio exp(old - error) by -0.2 .. 0.2.
  error = np.mean((v - target) ** 2, axis=(1, 2, 3))
  shift = np.array([0.2, -0.2, 0.01, -0.01, 0.2, -0.2, 0.03, -0.1])
  old = target + (v - target) * np.sqrt((error + shift) / error)[:, None, None, None]
  advantages = np.array([1.5, 1.0, -0.5, -2.0, -1.0, -1.5, 6.0, 0.7])
  model_v = torch.tensor(v, requires_grad=True)
  loss, should_clip = dgpo_clip_dsm_loss_torch(model_v, torch.tensor(old), torch.tensor(ref), torch.tensor(target),
                                               torch.tensor(advantages), 5.0, clip, 1.0, 4)
  loss.backward()
  clipped = should_clip.numpy()
  assert clipped.any() and (~clipped).any() and (clipped & (advantages > 0)).any() and (clipped & (advantages < 0)).any()

  f32 = lambda x: jnp.asarray(x, jnp.float32)
  ref_error = np.mean((ref - target) ** 2, axis=(1, 2, 3))
  weights = matching.dgpo_group_weights(f32(error - ref_error)[:, None], f32(np.clip(advantages, -5, 5)), 4, 1.0)
  mb = dm.MatchingRollout(cond=None, target_size=None, crop=None, x0=None, noise_keys=None, timesteps=None,
                          sigmas=None, old_logp=None, advantages=f32(advantages), mask=None, weights=weights)
  mask = jnp.ones((b,), jnp.float32)

  def loss_of(v_, clip_range):
    objective = dgpo.DgpoObjective(beta_dpo=1.0, adv_clip_max=5.0, group_size=4, clip_range=clip_range)
    numerator, aux, _ = objective.slot_loss(v_, None, f32(target), None, mb, 0, {"ema": f32(old)}, True, None,
                                            mask, 0.0)
    return numerator / aux["denominator"], aux

  (got, aux), grad = jax.value_and_grad(loss_of, has_aux=True)(f32(v), clip)
  np.testing.assert_allclose(float(got), loss.item(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), model_v.grad.numpy(), rtol=1e-5, atol=1e-9)
  assert float(aux["clip_frac"]) == clipped.mean()
  np.testing.assert_array_equal(np.abs(np.asarray(grad)).sum(axis=(1, 2, 3)) == 0, clipped)  # weights ~0.5: none 0
  unclipped = jax.grad(lambda v_: loss_of(v_, 0.0)[0])(f32(v))
  assert not np.allclose(np.asarray(unclipped)[clipped], np.asarray(grad)[clipped])


def test_dgpos_released_split_samples_guided_and_trains_without_guidance():
  """decoder.train_guidance=4.5 with decoder.loss_guidance=1.0 (DGPO's released sampling at 4.5, loss velocities
  with cfg=False): the rollout decodes at 4.5, the update's velocities run one conditional pass (its FLOPs count
  one branch); unset, the loss takes the rollout's. With dgpo_clip_dsm the update also runs the average."""
  from configs import demo_decoder
  from glmrl.policy import dgpo
  from glmrl.policy.base import FlopCounts

  config = demo_decoder.get_config("dgpo")  # DGPO's released split and clip_dsm (configs/released.py)
  assert (config.decoder.train_guidance, config.decoder.loss_guidance) == (4.5, 1.0) and config.decoder.dgpo_clip_dsm
  config.decoder.dgpo_clip_dsm = False
  split = dgpo.DgpoPolicy(config)
  config.decoder.loss_guidance = 0.0
  same = dgpo.DgpoPolicy(config)
  config.decoder.loss_guidance = 1.0
  assert same.guidance == split.guidance == 4.5
  assert same.spec(8).guidance_scale == 4.5 and split.spec(8).guidance_scale == 1.0
  counts = FlopCounts(ar_forward=0.0, dit_pass=1.0, images=8)
  assert split.update_flops(counts) * 2 == same.update_flops(counts)
  config.decoder.dgpo_clip_dsm, config.decoder.ema.every = True, 1
  clipped = dgpo.DgpoPolicy(config)
  assert clipped.objective.clip_range == config.decoder.clip_range and clipped.spec(8).uses_average
  assert clipped.anchor_passes(8) == split.anchor_passes(8) + 1
  # One reference pass per trained slot, for the weights and the KL (beta 0.02); the weights from the gradient
  # pass's forward when one micro-batch holds every group, else a forward of the policy before it: 5 or 6 passes
  # per trained slot with LoRA (glmrl.policy.dit.DitPolicy.update_flops), 7 before either was shared.
  assert split.settings.beta > 0 and split.anchor_passes(8) == 1
  config.decoder.dgpo_clip_dsm, config.decoder.micro_batch_size = False, 4
  halves = dgpo.DgpoPolicy(config)
  assert halves.anchor_passes(8) == 2 and halves.update_flops(counts) * 4 == split.update_flops(counts) * 5


def test_dgpos_compiled_update_runs_its_velocities_unguided_at_loss_guidance_1():
  """The lowered update of `:dgpo` (abstractly, as --mode=compile builds it on v5e-8): at loss_guidance 1.0 it is
  the CFG-free recipe's program (the same dot products: the rollout's guidance 4.5 does not enter it); at the
  rollout's guidance every DiT pass runs both branches, about twice the dots (all but the few outside the DiT). Its
  KL (decoder.beta 0.02) adds none: it reads the reference velocities the group weights are made with. In one
  micro-batch (the demo's) the gradient's pass makes the weights from its own forward; in two (a group's rows in
  both) a pass before it runs the policy's forward besides: one DiT forward's dots more, as many as the moving
  average's forward for clip_dsm adds."""
  from configs import demo_decoder
  from glmrl.programs import abstract, topology
  from glmrl.programs import compile_mode as mode_lib

  def dots(**settings):
    config = demo_decoder.get_config("dgpo")
    config.data.prompts_per_step = 8  # one AR row per chip
    for key, value in settings.items():
      config.decoder[key] = value
    run = abstract.build(config, mode_lib._mesh(config, topology.devices(topology.parse("v5e-8"))))  # pylint: disable=protected-access
    return abstract.update(run, "decoder").lowered.as_text().count("stablehlo.dot_general")

  split, cfg_free, guided = dots(), dots(train_guidance=1.0), dots(loss_guidance=0.0)
  assert split == cfg_free
  assert guided > split and 0 <= 2 * split - guided < split // 10, (split, guided)
  # Its KL to the reference reads the reference velocities the group weights are made with: no pass of its own.
  assert dots(beta=0.0) == split
  forward = split - dots(dgpo_clip_dsm=False)  # the moving average's forward (clip_dsm's)
  assert forward > 0 and dots(micro_batch_size=32) - split == forward, (split, forward)
