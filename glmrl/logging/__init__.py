"""Run logging: scalars (tensorboard, metrics.jsonl, console), captioned sample grids; metric plots in
`glmrl.logging.plot` (not imported here: `python -m glmrl.logging.plot` runs that module as __main__)."""

from glmrl.logging.images import make_grid
from glmrl.logging.metrics import MetricsWriter, NullWriter, run_writer, sample_captions

__all__ = ["MetricsWriter", "NullWriter", "make_grid", "run_writer", "sample_captions"]


def quiet_library_logs() -> None:
  """Keeps the console to one progress line per step: drops INFO chatter of checkpointing libraries."""
  import logging as std_logging
  from absl import logging as absl_logging

  class _Filter(std_logging.Filter):
    def filter(self, record):
      if "orbax" not in record.pathname:
        return True
      # Orbax warns whenever a manager opens read-only, as eval and generate open the run's checkpoints.
      return record.levelno >= std_logging.WARNING and not record.getMessage().startswith("Given directory is read only")

  absl_logging.get_absl_logger().addFilter(_Filter())
