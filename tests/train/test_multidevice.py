"""The same train steps on 1 CPU device and on 8 host devices with a 2x2x2 (data, fsdp, tensor) mesh.

Tolerance: 1e-4 relative on the step metrics and parameter sums, 1e-5 absolute on the on-policy loss
(which is zero up to rounding); float32, the sharded reductions sum in a different order.
"""


import numpy as np

from tests.cli import TIMEOUT_S
from tests.train.common import device_run


def run(devices, mesh, workdir):
  return device_run("tests.train.multidevice_run", devices, mesh, workdir, timeout=TIMEOUT_S)


def test_one_device_equals_eight(tmp_path):
  one = run(1, "1,1,1", tmp_path / "one")
  eight = run(8, "2,2,2", tmp_path / "eight")
  assert one["devices"] == 1 and eight["devices"] == 8
  # The parameters really are split over fsdp and tensor on the 8-device mesh.
  assert any("fsdp" in s for s in eight["shardings"]) and any("tensor" in s for s in eight["shardings"])
  for a, b in zip(one["steps"], eight["steps"]):
    for k in ("reward/mean", "grad_norm", "advantage/std", "first_iter/ratio/max"):
      np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
    # On-policy the loss is -mean(advantages), zero up to rounding: compare it absolutely.
    np.testing.assert_allclose(b["loss"], a["loss"], atol=1e-5)
  np.testing.assert_allclose(eight["param_sum"], one["param_sum"], rtol=1e-4)
  np.testing.assert_allclose(eight["param_abs_sum"], one["param_abs_sum"], rtol=1e-4)
  # Micro-batches of 4 rows on fsdp = 8 devices (as 16 on a 32-chip slice): allowed, and the same numbers.
  fsdp8 = run(8, "1,8,1", tmp_path / "fsdp8")
  for a, b in zip(one["steps"], fsdp8["steps"]):
    for k in ("reward/mean", "grad_norm", "advantage/std"):
      np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
  np.testing.assert_allclose(fsdp8["param_sum"], one["param_sum"], rtol=1e-4)


def test_optimizer_state_is_sharded_like_the_parameters(tmp_path):
  """fsdp=4 x tensor=2: each device holds its share of the AdamW moments, not all of them (before and after
  updates)."""
  out = run(8, "1,4,2", tmp_path / "fsdp4_tensor2")
  for when, layout in out["layout"].items():
    assert layout["opt_leaves_not_like_params"] == [], when
    # Two float32 moments per float32 parameter; only the step counters (a few bytes) are replicated.
    assert layout["opt_state_dev0"] <= 2 * layout["params_dev0"] + 64, (when, layout)
