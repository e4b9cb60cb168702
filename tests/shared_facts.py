"""The released checkpoint's configuration facts, copied into `tests/fixtures/released/`."""

import json
import pathlib

GLM_IMAGE = pathlib.Path(__file__).resolve().parent / "fixtures" / "released"


def read_json(name: str) -> dict:
  return json.loads((GLM_IMAGE / name).read_text())
