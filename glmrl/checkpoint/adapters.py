"""A LoRA policy's adapters record: a run resumes, evaluates and exports its adapters only onto the base they
were trained on, and never mixes adapter and full fine-tuning checkpoints."""

from __future__ import annotations

import json
import os

from absl import logging

from glmrl.checkpoint import fingerprint as fingerprint_lib
from glmrl.checkpoint.errors import CheckpointError


def check_adapters(directory: str, adapters: dict | None, has_steps: bool, file: str, section: str) -> None:
  """The run's adapters (`{"rank", "alpha", "targets", "base": {"checkpoint_dir", "fingerprint"}}`, or
  None for full fine-tuning) must be those `directory`'s checkpoints were trained with: adapters never
  resume onto another base, and full fine-tuning and adapter checkpoints never mix. `file`: the policy's record
  (`glmrl.policy.base.Saved.adapters_file`); `section`: its LoRA settings' config path, for messages."""
  path = os.path.join(directory, file)
  recorded = None
  if os.path.isfile(path):
    with open(path) as f:
      recorded = json.load(f)
  if not has_steps or recorded == adapters:
    return
  if recorded is None:
    raise CheckpointError(f"{directory} holds full fine-tuning checkpoints but this run trains LoRA adapters "
                          f"({section}.rank > 0): use a new --workdir")
  if adapters is None:
    raise CheckpointError(f"{directory} holds LoRA adapter checkpoints ({path}: rank {recorded.get('rank')}) but "
                          f"this run is full fine-tuning ({section}.rank=0): set the same {section}, or use a "
                          "new --workdir")
  base, run_base = recorded.get("base") or {}, adapters.get("base") or {}
  # A fingerprint in the earlier, rounded-float form rounds differently from one CPU to another: such a base is
  # checked by its folder alone (and the record is rewritten in the exact form after this check).
  legacy = fingerprint_lib.is_legacy(base.get("fingerprint"))
  if base != run_base and not (legacy and base.get("checkpoint_dir") == run_base.get("checkpoint_dir")):
    raise CheckpointError(f"refusing to resume: the adapters in {directory} were trained on the base "
                          f"{recorded.get('base')} ({path}), this run's base is {adapters.get('base')}; "
                          "point config.model.checkpoint_dir at the base they were trained on, or use a new --workdir")
  if {**recorded, "base": None} == {**adapters, "base": None}:
    if legacy:
      logging.warning("%s records its base's fingerprint in the earlier, rounded-float form, whose rounding "
                      "differs between CPUs: the base is checked by its checkpoint_dir only (%s)", path,
                      base.get("checkpoint_dir"))
    return
  diff = sorted(k for k in set(recorded) | set(adapters) if recorded.get(k) != adapters.get(k))
  raise CheckpointError(f"{directory} holds adapters with other settings ({path}): "
                        + ", ".join(f"{k} {recorded.get(k)!r} there, {adapters.get(k)!r} here" for k in diff))
