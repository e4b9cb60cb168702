"""glmrl's import graph, read from its files: every import counts, also one inside a function (a lazy import saves
start-up time, it does not make a lower module's dependence on a higher one go away). Read by
`tests/test_import_graph.py` and `bench/config_trip.py`."""

import ast
import functools
import os

from tests.cli import ROOT


def module_name(path: str, root: str = ROOT) -> str:
  """The dotted name of the module in file `path` of the checkout at `root`."""
  return os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")


def _modules(root: str) -> dict[str, str]:
  """glmrl's module names in the checkout at `root` -> their files."""
  out = {}
  for folder, _, files in os.walk(os.path.join(root, "glmrl")):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        out[module_name(path, root)] = path
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


def graph(root: str = ROOT) -> dict[str, set[str]]:
  """glmrl's module names in the checkout at `root` -> the glmrl modules each imports."""
  modules = _modules(root)
  return {m: _imports(m, path, modules) for m, path in modules.items()}


def cycles(imports: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node of `imports` (Tarjan's algorithm, iteratively)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []
  for root in imports:
    if root in index:
      continue
    work = [(root, iter(sorted(imports[root])))]
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
        work.append((child, iter(sorted(imports[child]))))
      elif child in on_stack:
        low[node] = min(low[node], index[child])
  return found


def floors(imports: dict[str, set[str]]) -> dict[str, int]:
  """Each module's floor in an acyclic `imports` graph: 0 when it imports no glmrl module, else one more than the
  highest floor it imports."""

  @functools.cache
  def floor(module: str) -> int:
    return 1 + max(map(floor, imports[module]), default=-1)

  return {m: floor(m) for m in imports}
