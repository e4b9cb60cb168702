"""config.rollout.ar_weights on 8 host devices (fsdp 4 x tensor 2): the sampler reads the generator cast to the
compute dtype and resharded without its fsdp split (in several consecutive programs), and draws the same ids
with the same log-probs as from the update's layout (greedy and sampled, the same keys). main.py trains with it on
two processes: tests/train/test_multihost.py."""

import numpy as np

from tests.train.common import device_run


def test_gathered_weights_sample_what_the_update_layout_samples(tmp_path):
  result = device_run("tests.sampling.rollout_layout_run", 8, "1,4,2", tmp_path)
  assert result["devices"] == 8
  assert result["reshard_parts"] > 2  # the reshard ran as consecutive programs
  for mode in ("greedy", "sampled"):
    update, gathered = result[f"update/{mode}"], result[f"gathered/{mode}"]
    assert any("fsdp" in s for s in update["specs"])  # the update's layout splits the generator over fsdp
    assert not any("fsdp" in s for s in gathered["specs"]) and any("tensor" in s for s in gathered["specs"])
    # The update's weights are float32; the sampler's copy is cast to the bfloat16 compute dtype.
    assert update["dtypes"] == ["float32"] and gathered["dtypes"] == ["bfloat16"]
    assert update["tokens"] == gathered["tokens"], mode
    np.testing.assert_allclose(gathered["logprobs"], update["logprobs"], rtol=0, atol=1e-5, err_msg=mode)
