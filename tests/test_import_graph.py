"""The library's import graph: what the top of `glmrl/` holds, and no cycle among its modules or its packages.

Every import counts, also one inside a function: a lazy import saves start-up time, it does not make a lower
module's dependence on a higher one go away.
"""

import ast
import os

from tests.cli import ROOT

PACKAGE = os.path.join(ROOT, "glmrl")
CONCEPTS = {"checkpoint", "data", "evaluation", "grpo", "logging", "models", "policy", "programs", "rewards",
            "sampling", "train"}
HOUSE = {"config", "runtime", "errors.py", "sharding.py", "__init__.py"}


def _modules() -> dict[str, str]:
  """glmrl's module names -> their files."""
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[dotted.removesuffix(".__init__")] = path
  return out


def _imports(module: str, path: str, modules) -> set[str]:
  """The glmrl modules `module` imports anywhere in its file (`from pkg import mod` names the module mod)."""
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
      found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
  return {m for m in found if m in modules and m != module}


def _graph():
  modules = _modules()
  return {m: _imports(m, path, modules) for m, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node (Tarjan's algorithm, iteratively)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []
  for root in graph:
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is None:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
          component = []
          while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
              break
          if len(component) > 1:
            found.append(sorted(component))
      elif child not in index:
        index[child] = low[child] = len(index)
        stack.append(child)
        on_stack.add(child)
        work.append((child, iter(sorted(graph[child]))))
      elif child in on_stack:
        low[node] = min(low[node], index[child])
  return found


def test_the_top_of_the_package_holds_the_concept_packages_and_the_house():
  held = {n for n in os.listdir(PACKAGE) if n != "__pycache__"}
  assert held == CONCEPTS | HOUSE


def test_no_module_imports_one_that_imports_it_back():
  assert _cycles(_graph()) == []


def test_the_packages_form_floors():
  # Package A above package B when a module of A imports one of B; no package is above itself.
  packages = {}
  for module, imported in _graph().items():
    top = ".".join(module.split(".")[:2])
    packages.setdefault(top, set()).update(".".join(m.split(".")[:2]) for m in imported)
  for top, below in packages.items():
    below.discard(top)
  del packages["glmrl"]  # glmrl/__init__.py: the library-wide settings (the platform choice) every import runs
  assert _cycles(packages) == []


def test_the_cycle_finder_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
