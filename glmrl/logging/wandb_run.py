"""Weights & Biases as a second home of the run's scalars and sample grids (`config.log.wandb`; TensorBoard and
metrics.jsonl are written either way; docs/wandb.md).

A training run's W&B run lives under `<workdir>/wandb/`; its id is kept in `<workdir>/wandb/train_run_id`, so a
resumed run (or a rerun after an interruption) goes on logging into the same W&B run. `--mode=eval` starts a W&B run
of its own each time (job type "eval"), since its steps (checkpoints, 0 for the initial models) would go backwards
in the training run's history. A resumed training run redoes the steps after its checkpoint; W&B keeps the values
first logged for those (its steps only go forward) while metrics.jsonl keeps the redone ones.
`log.wandb_mode="offline"` writes everything locally (`wandb sync DIR` uploads it later) and needs no network or
account.

W&B's own environment variables hold where the config leaves a setting empty (its default): `WANDB_PROJECT`,
`WANDB_NAME`, `WANDB_MODE` (`offline`, `disabled`, ...) and `WANDB_DIR` (where W&B writes its files; the run id file
stays in the workdir), as they do for any W&B script; else the project is `glmrl`, the name the workdir's and the
mode `online`."""

from __future__ import annotations

import os
import uuid
from typing import Mapping

from glmrl.errors import UserError

MODES = ("", "online", "offline", "disabled")  # "": $WANDB_MODE, else online
DEFAULT_PROJECT = "glmrl"
_ID_FILE = "train_run_id"


def _run_id(directory: str, job: str) -> str | None:
  """The training run's W&B id, created on its first start and kept in `directory`; None (a new id) for other jobs."""
  if job != "train":
    return None
  path = os.path.join(directory, _ID_FILE)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return f.read().strip()
  run_id = uuid.uuid4().hex[:12]
  with open(path, "w", encoding="utf-8") as f:
    f.write(run_id + "\n")
  return run_id


def _mode(mode: str) -> str:
  """The config's mode, else $WANDB_MODE, else online."""
  return mode or os.environ.get("WANDB_MODE") or "online"


def _not_started(mode: str, error: Exception) -> UserError:
  return UserError(f"log.wandb: W&B did not start a run in mode {mode!r} ({type(error).__name__}: {error}); "
                   "--config.log.wandb_mode=offline (or WANDB_MODE=offline) logs without an account or network")


def check_login(mode: str) -> None:
  """UserError, before any model is built, when an online run (`mode`, resolved as `WandbRun` does) has no W&B
  account to log in with: no API key, or one its server refuses or cannot be reached to check. Offline and
  disabled runs need none."""
  mode = _mode(mode)
  if mode != "online":
    return
  import wandb  # optional (requirements-wandb.txt); the config check names it before anything is built

  try:
    wandb.login(verify=True)
  except Exception as e:  # noqa: BLE001  (no key, a refused key, no network: one line)
    raise _not_started(mode, e) from None


class WandbRun:
  """`add_scalars`, `add_image` and `close` into one W&B run, as `MetricsWriter` writes them to TensorBoard."""

  def __init__(self, workdir: str, *, project: str, name: str, mode: str, job: str, config: Mapping | None = None):
    import wandb  # optional (requirements-wandb.txt); the config check names it before anything is built

    self._wandb = wandb
    directory = os.path.join(workdir, "wandb")
    os.makedirs(directory, exist_ok=True)
    # The config's value, else W&B's environment variable, else glmrl's default: resolved here, since the
    # arguments of wandb.init win over the variables and W&B reads them once per process.
    env = os.environ
    project = project or env.get("WANDB_PROJECT") or DEFAULT_PROJECT
    name = name or env.get("WANDB_NAME") or os.path.basename(os.path.abspath(workdir))
    mode = _mode(mode)
    try:
      self._run = wandb.init(project=project, name=name, mode=mode, dir=env.get("WANDB_DIR") or workdir,
                             id=_run_id(directory, job),
                             resume="allow" if job == "train" else None, job_type=job, config=dict(config or {}))
      self._first_new_step = self._run.step  # 0 for a new run; past the last logged step for a resumed one
    except Exception as e:  # noqa: BLE001  (no account, no network, a bad project name: one line)
      raise _not_started(mode, e) from e

  def _log(self, values: dict, step: int) -> None:
    if step >= self._first_new_step:  # W&B would drop an earlier step with a warning per call
      self._run.log(values, step=step)

  def add_scalars(self, step: int, values: Mapping[str, float]) -> None:
    self._log(dict(values), step)

  def add_image(self, tag: str, image_HxWxC, step: int) -> None:
    self._log({tag: self._wandb.Image(image_HxWxC)}, step)

  def close(self) -> None:
    self._run.finish()
