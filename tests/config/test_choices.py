"""What main.py's flags need is light: `--help` and a mistyped flag import no model code, and the choices they offer
are the library's own."""

import subprocess
import sys

import pytest

from glmrl.config import choices
from tests.cli import ROOT

# The packages that hold the models and everything built on them: none is imported before the flags are parsed.
HEAVY = ("glmrl.models", "glmrl.policy", "glmrl.rewards", "glmrl.grpo", "glmrl.sampling", "glmrl.programs",
         "glmrl.evaluation", "glmrl.checkpoint", "glmrl.train", "glmrl.data", "glmrl.logging", "orbax", "transformers",
         "torch", "optax")


def _imported(*flags) -> tuple[set, subprocess.CompletedProcess]:
  """The modules `python main.py FLAGS` imported (python -X importtime), and the run."""
  done = subprocess.run([sys.executable, "-X", "importtime", "main.py", *flags], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  modules = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
  return modules, done


@pytest.mark.parametrize("flags", [("--help",), ("--workdir=/tmp/x", "--mode=trian"), ("--nosuchflag=1",)],
                         ids=["help", "mistyped_mode", "unknown_flag"])
def test_help_and_a_mistyped_flag_import_no_model_code(flags):
  modules, done = _imported(*flags)
  assert "glmrl.config.choices" in modules, done.stderr[-2000:]  # the measurement itself works
  heavy = sorted(m for m in modules if m.startswith(HEAVY))
  assert not heavy, heavy[:10]
  if flags == ("--help",):
    assert done.returncode == 0 and "--mode" in done.stdout, done.stderr[-2000:]
  else:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]


def test_the_choices_are_the_librarys():
  from glmrl.models import glm_image
  from glmrl.policy import registry

  assert choices.DTYPES == tuple(glm_image.DTYPES)
  assert set(choices.POLICIES) == {"+".join(p) for p in (("ar",), ("decoder",), ("ar", "decoder"))}
  assert all(set(p.split("+")) <= set(registry.SAVED) for p in choices.POLICIES)
