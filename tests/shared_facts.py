"""The released checkpoint's configuration facts, in `shared/glm_image/` beside the repository."""

import json
import pathlib

GLM_IMAGE = pathlib.Path(__file__).resolve().parents[2] / "shared" / "glm_image"


def read_json(name: str) -> dict:
  return json.loads((GLM_IMAGE / name).read_text())
