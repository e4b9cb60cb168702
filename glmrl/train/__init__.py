"""The run's modes over the trained policies (`glmrl.policy`): setup from the config, the rollout shared by
every policy, the training loop, evaluation and generation."""
