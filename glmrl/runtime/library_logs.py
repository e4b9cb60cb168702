"""Records of other libraries' Python loggers that tell a glmrl user nothing, dropped at the logger that emits
them (a filter per record, not per level: every other record of those loggers is kept). Standard library only:
glmrl/__init__.py installs them before any of those libraries is imported.

- transformers says "PyTorch was not found. Models won't be available ..." at its import wherever torch is not
  installed; glmrl uses its tokenizers only, which need no torch.
"""

import logging

# logger name -> the start of each message of it that is dropped
DROPPED = {
    "transformers": ("PyTorch was not found.",),
}


class _Drop(logging.Filter):
  def __init__(self, starts: tuple[str, ...]):
    super().__init__()
    self.starts = starts

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(self.starts)


def drop_known_noise() -> None:
  """Installs the filters of `DROPPED` (once per logger)."""
  for name, starts in DROPPED.items():
    logger = logging.getLogger(name)
    if not any(isinstance(f, _Drop) for f in logger.filters):
      logger.addFilter(_Drop(starts))
