"""The docs' generator scripts (docs/*.py, not a package) loaded as modules, for the tests."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name: str):
  """docs/<name>.py as the module `name` (registered: its dataclasses look their module up there)."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "docs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module
