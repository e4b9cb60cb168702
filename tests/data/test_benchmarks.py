"""The shipped benchmark prompt sets: each loads as a prompt file with its counts, categories and metadata, names
its source and licence, and `NAME:N` takes a fixed seeded subset in file order."""

import os

import pytest

from glmrl.data import benchmarks
from glmrl.errors import UserError

COUNTS = {"parti": 1632, "geneval": 553, "ocr": 1018, "pickscore": 2048}


@pytest.mark.parametrize("name", benchmarks.NAMES)
def test_each_benchmark_loads_with_its_metadata_source_and_licence(name):
  records = benchmarks.load(name, seed=0)
  assert len(records) == COUNTS[name]
  assert all(r.prompt and isinstance(r.metadata.get("category"), str) for r in records)
  readme = open(os.path.join(benchmarks.HERE, "README.md"), encoding="utf-8").read()
  assert f"| `{name}` | {COUNTS[name]:,} |" in readme
  licence = {"parti": "LICENSE-parti.txt", "geneval": "LICENSE-geneval.txt"}.get(name, "LICENSE-diffusionnft.txt")
  assert os.path.isfile(os.path.join(benchmarks.HERE, licence)) and licence in readme
  if name == "geneval":
    assert {r.metadata["category"] for r in records} == {"single_object", "two_object", "counting", "colors",
                                                         "position", "color_attr"}
    assert all(r.metadata["include"] for r in records)
  if name == "ocr":
    assert all(r.metadata["text"].split()[0] in r.prompt for r in records)
  if name == "parti":
    assert len({r.metadata["category"] for r in records}) == 12 and "challenge" in records[0].metadata


def test_a_subset_is_seeded_and_in_file_order():
  full = benchmarks.load("parti", seed=0)
  a, b, c = (benchmarks.load("parti:16", seed=s) for s in (5, 5, 6))
  assert [r.prompt for r in a] == [r.prompt for r in b] != [r.prompt for r in c]
  lines = [r.line for r in a]
  assert len(a) == 16 and lines == sorted(lines) and {r.prompt for r in a} <= {r.prompt for r in full}


@pytest.mark.parametrize("spec,message", [("drawbench", "no such benchmark"), ("parti:0", "a number of prompts >= 1"),
                                          ("parti:x", "a number of prompts >= 1"), ("ocr:5000", "asks for 5000")])
def test_bad_names_and_counts(spec, message):
  with pytest.raises(UserError, match=message):
    benchmarks.load(spec, seed=0)
