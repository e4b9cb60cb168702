"""GRPO mathematics as pure, jit-compatible functions (public API)."""

from glmrl.grpo.advantages import constant_groups, group_advantages
from glmrl.grpo.logprobs import token_logprobs
from glmrl.grpo.loss import policy_loss, truncated_is_weights

__all__ = ["constant_groups", "group_advantages", "token_logprobs", "policy_loss", "truncated_is_weights"]
