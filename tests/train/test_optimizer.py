import ml_collections
import numpy as np

from glmrl.train import optimizer


def test_schedule_warms_up_from_the_first_update_and_decays_to_zero():
  cfg = ml_collections.ConfigDict(dict(learning_rate=1.0, warmup_steps=4, weight_decay=0.0, b1=0.9, b2=0.999,
                                       max_grad_norm=1.0))
  schedule = optimizer.learning_rate_schedule(cfg, num_steps=10)
  values = np.array([float(schedule(k)) for k in range(10)])
  np.testing.assert_allclose(values[:4], [0.25, 0.5, 0.75, 1.0], rtol=1e-6)
  assert np.all(np.diff(values[3:]) < 0) and values[-1] == 0.0
