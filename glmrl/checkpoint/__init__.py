"""Orbax checkpoints of the training state and clean shutdown on signals."""

from glmrl.checkpoint.errors import CheckpointError
from glmrl.checkpoint.manager import TrainCheckpointer
from glmrl.checkpoint.signals import StopSignal

__all__ = ["CheckpointError", "TrainCheckpointer", "StopSignal"]
