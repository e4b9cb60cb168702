"""Run logging: scalars (tensorboard, metrics.jsonl, console), captioned sample grids, metric plots."""

from glmrl.logging.images import make_grid
from glmrl.logging.metrics import MetricsWriter, sample_captions
from glmrl.logging.plot import plot_metric, read_metric

__all__ = ["MetricsWriter", "make_grid", "plot_metric", "read_metric", "sample_captions"]
