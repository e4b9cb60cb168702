"""Held-out benchmark prompt sets shipped with glmrl, selected by name (`config.eval.benchmark`): the files beside
this module, their sources and licences in its README.md.

`NAME` takes every prompt in the file's order; `NAME:N` a fixed subset of N prompts drawn without replacement with
`config.eval.seed` and kept in file order (the same subset for every checkpoint and every run with that seed).
"""

from __future__ import annotations

import os

import numpy as np

from glmrl.data.prompts import PromptRecord, load_prompts
from glmrl.errors import UserError

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ("parti", "geneval", "ocr", "pickscore")


def parse(spec: str) -> tuple[str, int | None]:
  """(name, N or None) of "NAME[:N]"; UserError naming the spec when it is not one."""
  name, _, count = spec.partition(":")
  if name not in NAMES:
    raise UserError(f"config.eval.benchmark={spec!r}: no such benchmark; shipped: {list(NAMES)} "
                    "(or pass a prompts file as config.eval.prompts_file)")
  if not count:
    return name, None
  if not count.isdigit() or int(count) < 1:
    raise UserError(f"config.eval.benchmark={spec!r}: the part after ':' must be a number of prompts >= 1")
  return name, int(count)


def path(name: str) -> str:
  return os.path.join(HERE, f"{name}.jsonl")


def subset(records: list[PromptRecord], count: int | None, seed: int, what: str) -> list[PromptRecord]:
  """`count` of `records` drawn without replacement with `seed`, in their order (all when count is None)."""
  if count is None:
    return records
  if count > len(records):
    raise UserError(f"{what}: asks for {count} prompts of {len(records)}")
  keep = np.sort(np.random.default_rng(seed).choice(len(records), size=count, replace=False))
  return [records[i] for i in keep]


def load(spec: str, seed: int) -> list[PromptRecord]:
  """The records of benchmark "NAME[:N]" (`parse`), a seeded subset when N is given."""
  name, count = parse(spec)
  return subset(load_prompts(path(name)), count, seed, f"config.eval.benchmark={spec!r}")
