"""`@pytest.mark.xdist_group(name)` honoured under pytest 9 (`--dist loadgroup`, pytest.ini).

pytest-xdist 3.8 groups a mark's tests by renaming each item on the workers to `nodeid@name`, through the item's
`_nodeid`; pytest 9 reads a node's id from `_id`, so the rename is lost and loadgroup scheduled every test alone: the
pod group's 2-process runs went to both workers at once on 2 cores, and two tests sharing an 8-device run each
waited on a worker of its own. Here the first worker writes the groups its items' marks name into a file the
controller named (`configure_node`), before it reports its collection; the controller's scheduler (`scheduler`)
reads them when it splits the collection into work units, which it does once every worker has reported.
"""

from __future__ import annotations

import json
import os
import tempfile

KEY = "glmrl_xdist_groups"  # the file's path in each worker's `workerinput`


def _path(config) -> str:
  """The controller's groups file (one per pytest run)."""
  if not hasattr(config, "_glmrl_xdist_groups"):
    config._glmrl_xdist_groups = os.path.join(tempfile.gettempdir(), f"glmrl_xdist_groups_{os.getpid()}.json")
  return config._glmrl_xdist_groups


def configure_node(node) -> None:
  """Controller: tell each worker where the groups go."""
  node.workerinput[KEY] = _path(node.config)


def groups(items) -> dict:
  """{nodeid: group} of the items an `xdist_group` mark names (xdist's rule: the mark's first argument, else its
  `name`, else "default"; several marks' names joined by "_")."""
  out = {}
  for item in items:
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    if names:
      out[item.nodeid] = "_".join(sorted(names))
  return out


def write(config, items) -> None:
  """Worker gw0: the collection's groups into the controller's file (the workers collect the same items)."""
  workerinput = getattr(config, "workerinput", None)
  if not workerinput or workerinput.get("workerid") != "gw0" or KEY not in workerinput:
    return
  path = workerinput[KEY]
  with open(f"{path}.partial", "w", encoding="utf-8") as f:
    json.dump(groups(items), f)
  os.replace(f"{path}.partial", path)


def scheduler(config, log):
  """Controller: xdist's loadgroup scheduling with the groups read from the file (None: another `--dist`)."""
  if config.getvalue("dist") != "loadgroup":
    return None
  from xdist.scheduler import LoadGroupScheduling  # pylint: disable=import-outside-toplevel

  path = _path(config)

  class MarkedGroupScheduling(LoadGroupScheduling):
    """A test's work unit is its group's, or the test alone."""
    _groups = None

    def _split_scope(self, nodeid: str) -> str:
      if self._groups is None:
        with open(path, encoding="utf-8") as f:
          self._groups = json.load(f)
      return self._groups.get(nodeid, nodeid)

  return MarkedGroupScheduling(config, log)


def remove(config) -> None:
  """Controller, at the end: the groups file."""
  if not hasattr(config, "workerinput") and hasattr(config, "_glmrl_xdist_groups"):
    for path in (config._glmrl_xdist_groups, f"{config._glmrl_xdist_groups}.partial"):
      if os.path.exists(path):
        os.remove(path)
