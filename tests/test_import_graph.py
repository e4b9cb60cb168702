"""The library's import graph (`tests/import_graph.py`): what the top of `glmrl/` holds, and no cycle among its
modules or its packages."""

import os

from tests.cli import ROOT
from tests.import_graph import cycles, floors, graph

PACKAGE = os.path.join(ROOT, "glmrl")
CONCEPTS = {"checkpoint", "data", "evaluation", "grpo", "logging", "models", "policy", "programs", "rewards",
            "sampling", "train"}
HOUSE = {"config", "runtime", "errors.py", "sharding.py", "__init__.py"}


def test_the_top_of_the_package_holds_the_concept_packages_and_the_house():
  held = {n for n in os.listdir(PACKAGE) if n != "__pycache__"}
  assert held == CONCEPTS | HOUSE


def test_no_module_imports_one_that_imports_it_back():
  assert cycles(graph()) == []


def test_the_packages_form_floors():
  # Package A above package B when a module of A imports one of B; no package is above itself.
  packages = {}
  for module, imported in graph().items():
    top = ".".join(module.split(".")[:2])
    packages.setdefault(top, set()).update(".".join(m.split(".")[:2]) for m in imported)
  for top, below in packages.items():
    below.discard(top)
  del packages["glmrl"]  # glmrl/__init__.py: the library-wide settings (the platform choice) every import runs
  assert cycles(packages) == []


def test_the_cycle_finder_finds_a_cycle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_floors_count_up_from_the_modules_that_import_none():
  assert floors({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == {"a": 2, "b": 1, "c": 0}
  floor = floors(graph())
  assert floor["glmrl.errors"] == 0 and floor["glmrl.train.loop"] > floor["glmrl.train.setup"] > floor[
      "glmrl.programs.plan"] > floor["glmrl.policy.registry"]
