"""The policies a run can train, by the name `config.train.policies` uses, bound to the run's config, and the
rollout they share. A new policy is its module and one line here."""

from __future__ import annotations

import functools

from glmrl.policy import ar, awm, dgpo, dit, flow_grpo, nft
from glmrl.policy.base import Policy, Request, Saved

# config.decoder.algorithm -> the DiT policy that implements it.
DIT_ALGORITHMS: dict[str, type] = {"flow_grpo": flow_grpo.FlowGrpoPolicy, "nft": nft.NftPolicy,
                                   "awm": awm.AwmPolicy, "dgpo": dgpo.DgpoPolicy}

# Where each policy a run may train keeps its state (by config.train.policies' word), whatever the run's config:
# what the export looks for in a run's folder.
SAVED: dict[str, Saved] = {"ar": ar.SAVED, "decoder": dit.SAVED}


def policy(name: str, config) -> Policy:
  """The policy `name` ("ar" | "decoder") bound to `config`: the decoder's is its `config.decoder.algorithm`."""
  cls = ar.ArPolicy if name == "ar" else DIT_ALGORITHMS[config.decoder.algorithm]
  return cls(config)


def trained(config) -> dict[str, Policy]:
  """The run's trained policies by name, bound to `config`, in `config.train.policies`' order ("ar", "decoder",
  "ar+decoder")."""
  return {name: policy(name, config) for name in config.train.policies.split("+")}


def shared_request(policies: dict[str, Policy]) -> Request:
  """One rollout serving every one of `policies`: prompts x token grids x decoder samples, prompt-major."""
  return functools.reduce(Request.__or__, (p.request for p in policies.values()), Request())


def rollout_request(config) -> Request:
  """The rollout the run of `config` shares between its trained policies (`shared_request`)."""
  return shared_request(trained(config))


def decoding(policies: dict[str, Policy]) -> Policy | None:
  """The trained policy that decodes the rollout's images itself (its rollout leg; a DiT policy), or None: the
  pipeline's own decode at the sampling settings."""
  return next((p for p in policies.values() if p.decodes), None)
