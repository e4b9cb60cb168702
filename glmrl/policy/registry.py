"""The policies a run can train, by the name `config.train.policies` uses, and the rollout they share."""

from __future__ import annotations

import functools

from glmrl.policy import ar, decoder, decoder_matching
from glmrl.policy.base import Policy, Request

# config.decoder.algorithm -> the decoder policy that implements it.
DECODER_ALGORITHMS: dict[str, Policy] = {"flow_grpo": decoder.POLICY, "nft": decoder_matching.NFT,
                                         "awm": decoder_matching.AWM}


def policy(name: str, config) -> Policy:
  """The policy `name` ("ar" | "decoder") of the run: the decoder's is its `config.decoder.algorithm`."""
  return ar.POLICY if name == "ar" else DECODER_ALGORITHMS[config.decoder.algorithm]


def trained(config) -> dict[str, Policy]:
  """The run's trained policies by name, in `config.train.policies`' order ("ar", "decoder", "ar+decoder")."""
  return {name: policy(name, config) for name in config.train.policies.split("+")}


def rollout_request(config) -> Request:
  """One rollout serving every trained policy: prompts x token grids x decoder samples, prompt-major."""
  return functools.reduce(Request.__or__, (p.request(config) for p in trained(config).values()), Request())
