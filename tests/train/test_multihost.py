"""Two processes x 4 CPU devices (gloo over loopback) train, save and resume as one run, launched as users
launch main.py (the README's demo command: the decoder in several calls), and match one process on 8 devices;
its host reward scored after the whole decode (`rollout.overlap_rewards=False`) the same run bit for bit;
`--mode=eval` (a shipped benchmark, two checkpoints compared) and `--mode=generate` on the checkpoints the two
processes wrote, as 2 processes and as 1, write the same report and samples.

Tolerances: step 1 (the initial parameters) within 1e-6 relative, the JPEG size reward (a discontinuous function
of the pixels) within 1e-3 at every step. After an update the two runs' gradients differ by their collectives'
summation order (~1e-6 relative): later steps' continuous metrics within 1e-4 relative, and AdamW's moments after
the 3 updates (the running means of the gradients and of their squares) within 1e-3 relative L2 over all
parameters, which a shuffled gradient misses by orders of magnitude. Not the parameters themselves: AdamW's first
steps move each by about lr * sign(gradient), whatever the gradient's size, so two runs fed unrelated gradients
end within a few learning rates of each other.

The same sign rule makes the demo's AdamW (eps 1e-8) amplify rounding: an element whose true gradient is zero (the
keys' biases: attention is invariant to a shift of every key) or nearly so moves by +-lr on the sign of its rounding
error, which the two layouts' summation orders draw differently. On an AMD EPYC host the launches' step-1 gradients
agreed within 2e-5 relative L2 while the parameters after that update differed by up to 6.8e-4 (0.7 lr), and step
2's gradient norms were 8.6e-4 apart, step 3's 12% (other tokens sampled). The runs compared here take eps 1e-3
(near the gradients' root mean square, ~3e-3 after clipping): an element's step is then lr * m / (sqrt(v) + eps), at
most lr * 1e3 * its rounding error, and the same launches agreed within 2.2e-6 at steps 2 and 3.

The JPEG reward weighs 1e-4. The two launches' decoders differ by rounding (the brightness reward ~1e-7 relative),
and one uint8 pixel rounding the other way changes an image's JPEG size by bytes; the advantages divide that by the
group's reward spread (~0.01). At weight 0.01 a DiT attention kernel that rounds differently (same launches, same
bounds) put step 1's mean reward 4.6e-6 and gradient norm 7.9e-6 apart, where the bound assumes values continuous in
the pixels. At 1e-4 the JPEG reward is still part of every advantage (its spread ~0.1% of theirs, by estimate: samples
scored by the wrong process would still move the gradient norm far past 1e-6), and one flip stays far under the bounds.
"""

import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.train.processes import assert_same_metrics, assert_same_training, launch, rows

# The README's demo command (one sample per device per decoder call: 16 images in 2 calls; the sampler reads the
# generator as `rollout.ar_weights=auto` picks on 8 host devices) with micro-batches of 4 over 8 devices (each
# partly replicated) and a checkpoint at step 2.
FLAGS = ("--config=configs/demo.py", "--config.train.micro_batch_size=4", "--config.checkpoint.save_interval=2",
         "--config.log.image_interval=2", "--config.optim.eps=1e-3",  # rounding not amplified (module docstring)
         # A host-side reward: each process scores its own samples. Its weight keeps the JPEG size's jumps out of
         # the compared values (see the module docstring).
         "--config.rewards=({'name': 'brightness', 'weight': 1.0}, {'name': 'jpeg_compressibility', 'weight': 1e-4})")
# Not the loss: on-policy with zero-mean advantages it is 0 up to rounding (~1e-6), whose sign is noise.
KEYS = ("reward/mean", "reward/jpeg_compressibility/mean", "grad_norm", "advantage/std", "policy/entropy")


def _single(shared_runs):
  """The reference: the same flags as 1 process x 8 devices, 3 steps at once (made once per session; its stderr in
  stderr.txt)."""
  def make(folder):
    (err,) = launch(folder, *FLAGS, "--config.train.num_steps=3", processes=1, devices=8)
    (folder / "stderr.txt").write_text(err)
  return shared_runs("demo_1x8", make)


@pytest.mark.makes_reference
def test_the_demo_trains_on_eight_devices_of_one_process(shared_runs):
  """The reference of the pod test below: 16 images decoded in two calls of one per device, micro-batches of 4
  rows over 8 devices, on-policy, checkpoints at steps 2 and 3."""
  single = _single(shared_runs)
  err = (single / "stderr.txt").read_text()
  assert "decoder calls of 8 samples" in err and "config.rollout.ar_weights=auto -> 'gathered'" in err
  got = rows(single)
  assert [r["step"] for r in got] == [1, 2, 3]
  assert all(r["first_iter/ratio/min"] == r["first_iter/ratio/max"] == 1.0 for r in got)
  assert {"2", "3"} <= set(os.listdir(single / "checkpoints"))


def _moments(workdir, step) -> dict:
  """{'mu': [leaves], 'nu': [leaves]}: AdamW's moments of the generator's parameters at `step`, as numpy arrays
  (whichever process layout wrote them), in one order."""
  path = str(workdir / "checkpoints" / str(step) / "opt_state")
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(path).item_metadata.tree
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  state = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
  out = {"mu": [], "nu": []}
  for keys, leaf in sorted(jax.tree_util.tree_leaves_with_path(state), key=lambda kv: jax.tree_util.keystr(kv[0])):
    kind = next((k.key for k in keys if getattr(k, "key", None) in out), None)
    if kind:
      out[kind].append(np.asarray(leaf, np.float64))
  assert out["mu"] and len(out["mu"]) == len(out["nu"]), jax.tree_util.keystr(keys)
  return out


# AdamW's moments after 3 updates, across all parameters: the first is the running mean of the gradients, the
# second of their squares. The two launches' were 2.5e-5 (first) and 2.4e-5 (second) apart, relative L2 (eps 1e-3,
# an AMD EPYC host); the pod run's own moments shuffled within each parameter, 1.41 and 1.25.
MOMENT_RTOL = 1e-3


def assert_same_moments(got: dict, want: dict, rtol: float = MOMENT_RTOL) -> None:
  """Each moment, all parameters' together, within `rtol` relative L2 of the reference's. Unlike the parameters
  (AdamW moves each by about the learning rate whatever its gradient), these carry the gradients themselves."""
  for kind in ("mu", "nu"):
    diff = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(got[kind], want[kind])))
    norm = np.sqrt(sum(np.sum(b ** 2) for b in want[kind]))
    assert norm > 0 and diff <= rtol * norm, f"{kind}: relative L2 distance {diff / norm:.3g} > {rtol}"


def _shuffled(moments: dict) -> dict:
  rng = np.random.default_rng(0)
  return {k: [rng.permutation(x.ravel()).reshape(x.shape) for x in v] for k, v in moments.items()}


@pytest.mark.xdist_group("pod")
def test_two_processes_train_resume_evaluate_and_generate_as_one_process_on_eight_devices(tmp_path, shared_runs):
  """One test, not a shared fixture: pytest-xdist may hand a module's tests to both workers, and each would train
  the pod run again. The 1-process reference is made once per session (`_single`), by the worker beside this one."""
  multi = tmp_path / "multi"
  launch(multi, *FLAGS, "--config.train.num_steps=2")
  # Its host reward scored after the whole decode instead of a decoder call at a time: the same run, bit for bit.
  serial = tmp_path / "serial"
  launch(serial, *FLAGS, "--config.train.num_steps=2", "--config.rollout.overlap_rewards=False")
  assert_same_training(serial, multi, 2)
  launch(multi, *FLAGS, "--config.train.num_steps=3")  # resumes from the checkpoint of step 2, saved by both
  single = _single(shared_runs)
  got, want = rows(multi), rows(single)
  assert [r["step"] for r in got] == [1, 2, 3]  # process 0 alone logs, no duplicates
  assert_same_metrics(got, want, KEYS, rtol_first=1e-6, rtol=1e-4)
  assert sorted(os.listdir(multi / "samples")) == sorted(os.listdir(single / "samples"))
  got_moments, want_moments = _moments(multi, 3), _moments(single, 3)
  assert_same_moments(got_moments, want_moments)
  with pytest.raises(AssertionError, match="relative L2 distance"):  # the check tells other gradients apart
    assert_same_moments(_shuffled(got_moments), want_moments)

  # --mode=eval (PartiPrompts, the initial models and step 2 compared) and --mode=generate (step 3) on the pod's
  # checkpoints, as 2 processes and as 1 process x 8 devices on a copy of the workdir.
  one = tmp_path / "one"
  shutil.copytree(multi, one)
  # The eval command of docs/evaluation.md: the demo's 32 prompt tokens hold none of PartiPrompts' longer prompts.
  # Scored by brightness alone: the report's per-reward means and intervals would show the JPEG size's jumps.
  evaluate = (*(f for f in FLAGS if not f.startswith("--config.rewards=")), "--mode=eval", "--config.eval.benchmark=parti:2", "--config.eval.steps=0,2",
              "--config.data.max_prompt_tokens=64", "--config.rewards=({'name': 'brightness', 'weight': 1.0},)")
  launch(multi, *evaluate)
  launch(one, *evaluate, processes=1, devices=8)
  got, want = (json.loads((w / "eval" / "report.json").read_text()) for w in (multi, one))
  assert got.keys() == want.keys() and got["steps"] == want["steps"] == [0, 2]
  np.testing.assert_allclose(_numbers(got), _numbers(want), rtol=1e-5, atol=1e-6)
  assert sorted(str(p.relative_to(multi)) for p in (multi / "eval" / "images").rglob("*.png")) == \
      sorted(str(p.relative_to(one)) for p in (one / "eval" / "images").rglob("*.png"))
  launch(multi, *FLAGS, "--mode=generate")
  launch(one, *FLAGS, "--mode=generate", processes=1, devices=8)
  got, want = (np.load(w / "generate" / "tokens.npz") for w in (multi, one))
  assert int(got["step"]) == int(want["step"]) == 3
  np.testing.assert_array_equal(got["tokens"], want["tokens"])
  np.testing.assert_allclose(got["logprobs"], want["logprobs"], rtol=1e-5, atol=1e-6)
  assert sorted(p.name for p in (multi / "generate").glob("*.png")) == \
      sorted(p.name for p in (one / "generate").glob("*.png"))
  assert (multi / "generate" / "grid.png").is_file()


def _numbers(tree) -> np.ndarray:
  """Every number of a JSON tree, in its order."""
  if isinstance(tree, dict):
    return np.concatenate([_numbers(v) for v in tree.values()] or [np.zeros(0)])
  if isinstance(tree, list):
    return np.concatenate([_numbers(v) for v in tree] or [np.zeros(0)])
  if isinstance(tree, (int, float)) and not isinstance(tree, bool):
    return np.asarray([float(tree)])
  return np.zeros(0)
