"""The command-line tools' one rule: the user's bad input is one line and status 2, a bug keeps its traceback."""

import pytest

from glmrl.errors import UserError, run_command


def test_bad_input_is_one_line_and_status_2(capsys):
  def refuse():
    raise UserError("--hf_dir 'x' is not a directory")

  assert run_command(refuse) == 2
  assert capsys.readouterr().err == "error: --hf_dir 'x' is not a directory\n"
  assert run_command(lambda: open("/nonexistent/params.json")) == 2
  assert capsys.readouterr().err.startswith("error: [Errno 2] No such file or directory: '/nonexistent/params.json'")


def test_a_bug_keeps_its_traceback_and_a_summary_line_is_printed(capsys):
  def bug():
    raise ValueError("operands could not be broadcast together with shapes (2,3) (4,)")  # numpy's, not the user's

  with pytest.raises(ValueError, match="broadcast"):
    run_command(bug)
  assert run_command(lambda: "wrote 3 files") == 0
  assert capsys.readouterr().out == "wrote 3 files\n"
