"""GRPO mathematics as pure, jit-compatible functions (public API)."""

from glmrl.grpo.advantages import group_advantages
from glmrl.grpo.logprobs import token_logprobs
from glmrl.grpo.loss import policy_loss

__all__ = ["group_advantages", "token_logprobs", "policy_loss"]
