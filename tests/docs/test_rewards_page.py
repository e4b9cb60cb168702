"""docs/rewards.md's table of the `remote` reward's kwargs names each argument its factory takes, with its default
(`glmrl.rewards.remote.remote_reward_factory`'s signature), and nothing else."""

import inspect
import os
import re

from glmrl.rewards import remote
from tests.cli import ROOT


def test_the_remote_rewards_kwargs_table_is_its_factorys_signature():
  text = open(os.path.join(ROOT, "docs", "rewards.md"), encoding="utf-8").read()
  table = text.split("The `remote` reward's `kwargs`", 1)[1].split("\n\n", 2)[1]
  rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]+?) \|", table, re.M)}
  parameters = inspect.signature(remote.remote_reward_factory).parameters
  assert list(rows) == list(parameters)
  for name, p in parameters.items():
    want = "(required)" if p.default is p.empty else f"`{p.default!r}`"
    assert rows[name] == want, (name, rows[name], want)
