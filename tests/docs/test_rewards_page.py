"""docs/rewards.md's tables of the `remote` and `vlm_judge` rewards' kwargs name each argument their factories take,
with its default (`glmrl.rewards.remote.remote_reward_factory`'s and `glmrl.rewards.vlm_judge.VlmJudge`'s
signatures), and nothing else."""

import inspect
import os
import re

import pytest

from glmrl.rewards import remote, vlm_judge
from tests.cli import ROOT


@pytest.mark.parametrize("name,factory", [("remote", remote.remote_reward_factory),
                                          ("vlm_judge", vlm_judge.vlm_judge_factory)])
def test_a_rewards_kwargs_table_is_its_factorys_signature(name, factory):
  text = open(os.path.join(ROOT, "docs", "rewards.md"), encoding="utf-8").read()
  table = text.split(f"The `{name}` reward's `kwargs`", 1)[1].split("\n\n", 2)[1]
  rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]+?) \|", table, re.M)}
  parameters = inspect.signature(factory).parameters
  assert list(rows) == list(parameters)
  for name, p in parameters.items():
    want = "(required)" if p.default is p.empty else f"`{p.default!r}`"
    assert rows[name] == want, (name, rows[name], want)
