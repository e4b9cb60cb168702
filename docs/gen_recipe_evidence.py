"""Writes configs/evidence/<algorithm>.txt: the lines of each released recipe's repository that configs/released.py
cites, read at the pinned commit, each with `CONTEXT` lines around it, so that the rows' quotes and values are
checked offline (tests/docs/test_released_recipes.py).

    python docs/gen_recipe_evidence.py --clone Luo-Yihong/DGPO=DIR --clone NVlabs/DiffusionNFT=DIR \\
        --clone scxue/advantage_weighted_matching=DIR

Each DIR is a git clone of the repository holding the recipe's commit (`git show COMMIT:PATH` reads it). A row whose
quote is not its cited line's text stops the script with the line it found.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import released  # noqa: E402

OUT = os.path.join(ROOT, "configs", "evidence")
CONTEXT = 2  # lines before and after each cited line


def path(algorithm: str) -> str:
  return os.path.join(OUT, f"{algorithm}.txt")


def header(recipe: released.Recipe) -> str:
  return (f"# {recipe.repository} at {recipe.commit}: the lines configs/released.py cites for {recipe.recipe}, "
          f"{CONTEXT} around each, as path:line: text (docs/gen_recipe_evidence.py)")


# A quote that assigns one literal: `name = 3e-4`, `config.x = True # comment`, `gradient_step_per_epoch=1,`.
ASSIGNMENT = re.compile(r"^[\w.]+\s*=\s*(?P<literal>[^#,]+?)\s*,?\s*(#.*)?$")


def parse(text: str) -> tuple[str, dict[tuple[str, int], str]]:
  """(the header line, {(path, line): the line's text}) of an evidence file."""
  first, *rest = text.splitlines()
  lines = {}
  for entry in rest:
    where, line, content = entry.split(":", 2)
    lines[(where, int(line))] = content[1:]  # after the separator's space
  return first, lines


def _same(value, released_value) -> bool:
  return isinstance(value, bool) == isinstance(released_value, bool) and value == released_value


def problems(recipe: released.Recipe, text: str) -> list[str]:
  """What of `recipe`'s rows its evidence file's `text` does not bear out: the header's commit, each row's quote
  at its cited line, and the value each quoted literal gives (`Setting.follows`, else the literal itself)."""
  first, lines = parse(text)
  out = [] if first == header(recipe) else [f"configs/evidence/{recipe.algorithm}.txt is not of {recipe.repository} "
                                            f"at {recipe.commit} ({first!r}): run docs/gen_recipe_evidence.py"]
  for row in recipe.settings:
    where, line = row.where.rsplit(":", 1)
    found = lines.get((where, int(line)))
    if found is None or found.strip() != row.quote:
      out.append(f"configs/released.py: the {recipe.algorithm} row {row.what!r} quotes {row.quote!r}; "
                 f"{row.where} reads {found.strip() if found is not None else 'nothing in the evidence'!r}")
      continue
    assigned = ASSIGNMENT.match(row.quote)
    if assigned is None:
      continue
    try:
      literal = ast.literal_eval(assigned.group("literal"))
    except (ValueError, SyntaxError):
      continue  # an expression, not a literal: the quote is the evidence
    value = row.follows(literal) if row.follows else literal
    if not _same(value, row.released):
      out.append(f"configs/released.py: the {recipe.algorithm} row {row.what!r} says {row.key or 'its value'}="
                 f"{row.released!r}, but its quote {row.quote!r} ({row.where}) gives {value!r}")
  return out


def render(recipe: released.Recipe, clone: str) -> str:
  files, cited = {}, set()
  for row in recipe.settings:
    where, line = row.where.rsplit(":", 1)
    cited.add((where, int(line)))
  out = [header(recipe)]
  for where, line in sorted(cited):
    if where not in files:
      files[where] = subprocess.run(["git", "-C", clone, "show", f"{recipe.commit}:{where}"], check=True,
                                    capture_output=True, text=True).stdout.splitlines()
  for row in recipe.settings:
    where, line = row.where.rsplit(":", 1)
    found = files[where][int(line) - 1].strip()
    if found != row.quote:
      sys.exit(f"{recipe.repository} {row.where}: the row quotes {row.quote!r}, the line is {found!r}")
  shown = sorted({(w, n) for w, line in cited for n in range(line - CONTEXT, line + CONTEXT + 1)
                  if 1 <= n <= len(files[w])})
  out += [f"{w}:{n}: {files[w][n - 1].rstrip()}" for w, n in shown]
  return "\n".join(out) + "\n"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clone", action="append", default=[], help="OWNER/NAME=DIR, one per recipe's repository")
  args = parser.parse_args(argv)
  clones = dict(c.split("=", 1) for c in args.clone)
  os.makedirs(OUT, exist_ok=True)
  for algorithm, recipe in released.RECIPES.items():
    if recipe.repository not in clones:
      sys.exit(f"--clone {recipe.repository}=DIR is missing")
    with open(path(algorithm), "w") as f:
      f.write(render(recipe, clones[recipe.repository]))
    print(f"wrote {path(algorithm)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
