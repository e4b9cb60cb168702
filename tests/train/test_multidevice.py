"""The same train steps on 1 CPU device and on 8 host devices with a 2x2x2 (data, fsdp, tensor) mesh.

Tolerance: 1e-4 relative on the step metrics and parameter sums, 1e-5 absolute on the on-policy loss
(which is zero up to rounding); float32, the sharded reductions sum in a different order.
"""

import numpy as np
import pytest

from tests.train.common import multidevice_runs

# With the ratio tests (tests/train/test_on_policy_ratio.py), which read the same runs.
pytestmark = pytest.mark.xdist_group("multidevice")


def test_one_device_equals_eight(shared_runs):
  one, eight = multidevice_runs(shared_runs, 1)["1,1,1"], multidevice_runs(shared_runs, 8)
  on_eight = eight["2,2,2"]
  # The parameters really are split over fsdp and tensor on the 8-device mesh.
  assert any("fsdp" in s for s in on_eight["shardings"]) and any("tensor" in s for s in on_eight["shardings"])
  for a, b in zip(one["steps"], on_eight["steps"]):
    for k in ("reward/mean", "grad_norm", "advantage/std", "first_iter/ratio/max"):
      np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
    # On-policy the loss is -mean(advantages), zero up to rounding: compare it absolutely.
    np.testing.assert_allclose(b["loss"], a["loss"], atol=1e-5)
  np.testing.assert_allclose(on_eight["param_sum"], one["param_sum"], rtol=1e-4)
  np.testing.assert_allclose(on_eight["param_abs_sum"], one["param_abs_sum"], rtol=1e-4)
  # Micro-batches of 4 rows on fsdp = 8 devices (as 16 on a 32-chip slice): allowed, and the same numbers.
  fsdp8 = eight["1,8,1"]
  for a, b in zip(one["steps"], fsdp8["steps"]):
    for k in ("reward/mean", "grad_norm", "advantage/std"):
      np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
  np.testing.assert_allclose(fsdp8["param_sum"], one["param_sum"], rtol=1e-4)


def test_optimizer_state_is_sharded_like_the_parameters(shared_runs):
  """data=2 x fsdp=2 x tensor=2: each device holds its share of the AdamW moments, not all of them (before and
  after updates); moments replicated over fsdp or tensor would put twice the bound or more on device 0."""
  for when, layout in multidevice_runs(shared_runs, 8)["2,2,2"]["layout"].items():
    assert layout["opt_leaves_not_like_params"] == [], when
    # Two float32 moments per float32 parameter; only the step counters (a few bytes) are replicated.
    assert layout["opt_state_dev0"] <= 2 * layout["params_dev0"] + 64, (when, layout)
