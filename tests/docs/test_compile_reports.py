"""docs/reference/fits.md is generated from the committed --mode=compile reports (docs/compile_reports.py):
the committed page is what the script writes from them now, and every committed report is a row it lists."""

import glob
import json
import os

from tests.docs import scripts


def _generator():
  return scripts.load("compile_reports")


def test_fits_page_is_generated_from_the_committed_reports():
  gen = _generator()
  with open(gen.OUT, encoding="utf-8") as f:
    assert f.read() == gen.render(), "docs/reference/fits.md is stale: run python docs/compile_reports.py"


def test_every_committed_report_is_a_listed_row():
  gen = _generator()
  rows = {row.name: row for row in gen.ROWS}
  reports = sorted(glob.glob(os.path.join(gen.REPORTS, "*.json")))
  assert reports, "no compile report is committed"
  for path in reports:
    name = os.path.basename(path)[:-len(".json")]
    assert name in rows, f"{path} is no row of docs/compile_reports.py"
    with open(path) as f:
      report = json.load(f)
    assert report["topology"] == rows[name].topology
    assert f"## {rows[name].config} on {rows[name].topology}" in gen.render()
