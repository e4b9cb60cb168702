"""Errors in what the user gave (config, flags, prompt files, checkpoint folders).

`main.py` prints a `UserError` as one line and exits with status 2; any other exception is a
bug and keeps its traceback.
"""


class UserError(ValueError):
  """Bad input from the user; the message names the value and where it came from."""
