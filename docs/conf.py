"""Sphinx configuration of glmrl's documentation (Sphinx + MyST-Parser).

    sphinx-build -W --keep-going -n -b html docs /tmp/docs_html

tests/docs/test_build.py runs that command: a warning (a broken cross-reference or internal link, a docstring
autodoc cannot read) fails it. The generated pages are committed: docs/reference/config.md
(`python docs/gen_config_reference.py`), docs/reference/released_recipes.md (`python docs/gen_released_recipes.py`)
and docs/reference/fits.md (`python docs/compile_reports.py`).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # autodoc imports glmrl from this checkout

project = "glmrl"
author = "glmrl contributors"
copyright = "glmrl contributors"  # pylint: disable=redefined-builtin  # Sphinx's name

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "compile_reports"]

# MyST: `[text](page.md)` and `[text](page.md#a-heading)` are checked cross-references (a missing page or
# heading is a warning, an error under -W); headings down to ### get anchors.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
suppress_warnings = []

# autodoc: the docstrings are the code's, written as plain text (backquoted names, formulas with |x| and *), not
# reStructuredText: each is shown as it is written, as a literal block. Signatures without type hints (they name
# jax and numpy types the docs do not describe); members in source order.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "furo"
html_title = "glmrl"


def _docstring_as_written(app, what, name, obj, options, lines):  # pylint: disable=unused-argument
  """autodoc-process-docstring: the docstring as a literal block (plain text, never parsed as markup)."""
  if any(line.strip() for line in lines):
    lines[:] = [".. code-block:: text", ""] + [f"   {line}" if line else "" for line in lines] + [""]


def setup(app):
  app.connect("autodoc-process-docstring", _docstring_as_written)
smartquotes = False  # "--config.x" and quotes stay as typed (no en dashes, no curly quotes)
