"""Other libraries' lines that tell a glmrl user nothing are dropped at their loggers (glmrl.runtime.library_logs):
transformers' "PyTorch was not found" where torch is not installed (here: made unimportable in a fresh process,
`sys.modules["torch"] = None`, which is what transformers' `find_spec` probe then sees), and nothing else of it."""

import subprocess
import sys

from tests.cli import ROOT

NO_TORCH = "import sys; sys.modules['torch'] = None; "
LINE = "PyTorch was not found."


def _stderr(code: str) -> str:
  result = subprocess.run([sys.executable, "-c", NO_TORCH + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stderr


def test_transformers_without_torch_says_nothing_under_glmrl_and_keeps_its_other_warnings():
  assert LINE in _stderr("from transformers import ByT5Tokenizer")  # what a user of transformers alone sees
  err = _stderr("import glmrl; from transformers import ByT5Tokenizer; from transformers.utils import logging; "
                "logging.get_logger('transformers').warning('another warning')")
  assert LINE not in err and "another warning" in err, err
