"""The policies a run can train, by the name `config.train.policies` uses, and the rollout they share."""

from __future__ import annotations

import functools

from glmrl.policy import ar, decoder
from glmrl.policy.base import Policy, Request

POLICIES: dict[str, Policy] = {p.name: p for p in (ar.POLICY, decoder.POLICY)}


def trained(config) -> dict[str, Policy]:
  """The run's trained policies by name, in `config.train.policies`' order ("ar", "decoder", "ar+decoder")."""
  return {name: POLICIES[name] for name in config.train.policies.split("+")}


def rollout_request(config) -> Request:
  """One rollout serving every trained policy: prompts x token grids x decoder samples, prompt-major."""
  return functools.reduce(Request.__or__, (p.request(config) for p in trained(config).values()), Request())
