"""A config built from a released recipe (`configs/released.py`, named by `config.decoder.recipe`) against that
recipe's rows: a setting changed away from its row is one warning naming the row, the repository's value and the
new one (a user's experiment, said once); another `decoder.algorithm` than the recipe's is refused, as its rows
would then configure an algorithm they were not released for."""

from __future__ import annotations

from absl import logging

from glmrl.config.inert import differs
from glmrl.config.rules import check


def changed_rows(values: dict) -> list[str]:
  """One line per row of `values["decoder.recipe"]`'s recipe that the config changes, each also logged as a
  warning; ConfigError for an unknown recipe or another algorithm than the recipe's. `values`: the config's
  leaves by dotted key (`glmrl.config.keys.leaves`)."""
  name = values["decoder.recipe"]
  if not name:
    return []
  from configs import released  # pylint: disable=import-outside-toplevel  (the rows, beside the configs)

  check(name in released.RECIPES, "config.decoder.recipe", name,
        f"must be '' or one of {list(released.RECIPES)} (configs/released.py)")
  recipe = released.RECIPES[name]
  check(values["decoder.algorithm"] == recipe.algorithm, "config.decoder.algorithm", values["decoder.algorithm"],
        f"config.decoder.recipe={name!r} holds the rows of {recipe.repository}'s released {recipe.algorithm!r} "
        f"recipe; train another algorithm from its own config (configs/demo_decoder.py:ALGORITHM)")
  lines = []
  for row in recipe.settings:
    if row.key and differs(values[row.key], row.demo_value):
      demo = "" if row.ours is released.RELEASED else f", the demo's {row.ours!r}"
      lines.append(f"config.{row.key}={values[row.key]!r} changes the released {name} recipe's row {row.what!r} "
                   f"({recipe.repository}@{recipe.commit} {row.where}: {row.quote!r}): the repository's value "
                   f"{row.released!r}{demo}")
  for line in lines:
    logging.warning("%s", line)
  return lines
