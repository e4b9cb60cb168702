"""What a run's checkpoints raise: one-line errors (`glmrl.errors.UserError`)."""

from __future__ import annotations

from glmrl.errors import UserError


class CheckpointError(UserError):
  """No step of a run's checkpoints folder restores; the message names the folder and each step's error."""


class CheckpointSaveError(UserError):
  """A checkpoint could not be written (a full disk, a folder gone): the run stops, its older steps intact."""
