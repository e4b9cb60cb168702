"""Training checkpoints: `<workdir>/checkpoints/<step>/{<each policy's items>,rng,meta}`.

Each trained policy saves its items under its own names (`glmrl.policy.base.Saved`): the AR generator's `params`
and `opt_state`, the DiT's `decoder_params` and `decoder_opt_state`, and a moving average where the run keeps one.
A policy's params item holds its whole model's parameter state (trainable and frozen parts, the same paths as a
converted checkpoint), so `python -m checkpoints_convert --to_hf --ckpt_dir=<workdir>` exports it; under LoRA only
its adapters, with a record of their settings and the identity of their base (`glmrl.checkpoint.adapters`). The
trained models' HF configs sit beside the steps (`ar_config.json`, `dit_config.json`), and the converted folder
the run started from as `source.json` (the export takes every other pipeline component from there).

A step that does not restore (a truncated or missing file) is reported and
the newest step that does restore is used; the unreadable steps are moved,
untouched, into `checkpoints/unreadable/` (see `restore_latest`).

With several processes the restore is agreed (glmrl.runtime.agreement): each process reads its own shards of a
step through a reader of its own (Orbax's barriers, device collectives, would hold the others while one process's
read fails), and the step is used only when every process read it; else every process tries the next older one.
"""

import contextlib
import json
import os
import shutil
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from glmrl.runtime import agreement
from glmrl.runtime import distributed
from glmrl.checkpoint.adapters import check_adapters
from glmrl.checkpoint.atomic import write_json_atomic
from glmrl.checkpoint.errors import CheckpointError, CheckpointSaveError
from glmrl.checkpoint.orbax_noise import ORPHANED_READS
from glmrl.checkpoint.step_files import step_problem
from glmrl.runtime.thread_errors import quiet_os_errors

AR_CONFIG_FILE = "ar_config.json"
SOURCE_FILE = "source.json"
UNREADABLE_DIR = "unreadable"
# Longest error summary quoted per step (TensorStore messages embed whole specs).
_SUMMARY_CHARS = 400


def read_source(directory: str) -> str | None:
  """The converted checkpoint a run started from ("" for a random preset), or None if not recorded."""
  path = os.path.join(directory, SOURCE_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    try:
      value = json.load(f)["checkpoint_dir"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise ValueError(f"{path}: expected {{\"checkpoint_dir\": ...}} ({e!r})") from e
  if not isinstance(value, str):
    raise ValueError(f"{path}: checkpoint_dir must be a string, got {value!r}")
  return value


def checkpoint_bytes(items: dict) -> float:
  """This process's bytes of one checkpoint of `items` (arrays or their abstract shapes): its share of their bytes,
  and 5% for metadata."""
  total = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(items))
  return total / jax.process_count() * 1.05


def check_space(folder: str, items: dict) -> None:
  """CheckpointSaveError when the disk of `folder` cannot hold one more checkpoint of `items` (before any model is
  built, from their abstract shapes)."""
  existing = os.path.abspath(folder)
  while not os.path.isdir(existing):  # the disk it will be made on
    existing = os.path.dirname(existing)
  need, free = checkpoint_bytes(items), shutil.disk_usage(existing).free
  if free < need:
    raise CheckpointSaveError(f"{folder}: {free / 2**20:.1f} MiB free, a checkpoint takes about "
                              f"{need / 2**20:.1f} MiB: free space or choose another --workdir")


class TrainCheckpointer:
  """CheckpointManager with async saves every `save_interval` steps, keeping the last `max_to_keep`.

  A step holds `rng`, `meta` and the trained policies' items by name (`glmrl.policy.base.Saved`)."""

  def __init__(self, workdir: str, save_interval: int, max_to_keep: int, *, items: tuple[str, ...] = (
      "params", "opt_state"), records: dict | None = None, adapters: dict | None = None,
               source_checkpoint_dir: str | None = None):
    """`items`: the trained states' item names. `records`: JSON files written beside the steps (file name ->
    value; e.g. `AR_CONFIG_FILE`, the models' HF configs for the export). `adapters`: each trained policy's
    adapters record file -> (its LoRA settings and base identity (`check_adapters`), or None for full fine-tuning;
    its LoRA config section, for messages). `source_checkpoint_dir`: the converted folder the run's
    models come from ("" for a random preset); recorded in source.json so the export can write a complete
    pipeline folder."""
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    os.makedirs(self.directory, exist_ok=True)
    # A background write that fails is raised again by the next save or wait (`_surfaced`), as one line.
    quiet_os_errors("orbax", "a checkpoint write failed in the background: %s")
    # Before anything is written: a mismatch leaves the folder as it was.
    has_steps = bool(saved_steps(workdir))
    for file, (record, section) in (adapters or {}).items():
      check_adapters(self.directory, record, has_steps, file, section)
    for file, value in (records or {}).items():
      write_json_atomic(os.path.join(self.directory, file), value)
    if source_checkpoint_dir is not None:
      source = os.path.abspath(source_checkpoint_dir) if source_checkpoint_dir else ""
      write_json_atomic(os.path.join(self.directory, SOURCE_FILE), {"checkpoint_dir": source})
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            save_interval_steps=save_interval, max_to_keep=max_to_keep, enable_async_checkpointing=True),
        item_names=(*items, "rng", "meta"))
    ORPHANED_READS.watch_saves(self.directory)
    self._bytes = 0.0  # of the last checkpoint saved, for a full disk's line
    for file, (record, _) in (adapters or {}).items():
      if record is not None:
        write_json_atomic(os.path.join(self.directory, file), record)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, items: dict, rng_key, meta: dict, *, force: bool = False) -> bool:
    """Saves (asynchronously) `items` (name -> state) if `step` is on the interval or `force`; returns whether
    it saved. CheckpointSaveError when this or an earlier asynchronous save failed (`_surfaced`)."""
    args = ocp.args.Composite(
        **{k: ocp.args.StandardSave(v) for k, v in items.items()},
        # The key is the same on every process: stored as host data (written once), not a device array.
        rng=ocp.args.StandardSave({"key_data": np.asarray(jax.random.key_data(rng_key))}),
        meta=ocp.args.JsonSave(meta))
    self._bytes = checkpoint_bytes(items)
    with self._surfaced():
      self.manager.check_for_errors()
      return self.manager.save(step, args=args, force=force)

  @contextlib.contextmanager
  def _surfaced(self):
    """A failed save (here or in an earlier step's background write) as one CheckpointSaveError, its partial
    folder removed: the steps saved before stay as they were. A full disk is a short line: the folder, the bytes
    a checkpoint takes and those free (Orbax's own error quotes its internal paths)."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except  # whatever the write failed with
      partial = self._remove_partial()
      intact = f"steps {saved_steps(os.path.dirname(self.directory)) or 'none'} are intact"
      if "No space left on device" in str(e):
        free = shutil.disk_usage(self.directory).free / 2**20
        size = f", {self._bytes / 2**20:.1f} MiB needed" if self._bytes else ""
        raise CheckpointSaveError(f"saving a checkpoint into {self.directory}: disk full ({free:.1f} MiB free{size}); "
                                  f"{intact}: free space and rerun to resume") from None
      raise CheckpointSaveError(
          f"saving a checkpoint into {self.directory} failed: {describe_failure(self.directory, e)}; the run "
          f"stopped, {intact}{' (removed the partial ' + ', '.join(partial) + ')' if partial else ''}; fix the "
          "folder, then rerun to resume") from None

  def _remove_partial(self, quiet_s: float = 1.0, limit_s: float = 30.0) -> list[str]:
    """Removes the failed step's temporary folders; returns their names. Orbax stops waiting at the first failed
    write while the step's other writes (TensorStore's, on its own threads) still land and recreate the folder:
    removed again until none has reappeared for `quiet_s` seconds (`limit_s` at most)."""
    removed = set()
    start = quiet = time.monotonic()
    while time.monotonic() - quiet < quiet_s and time.monotonic() - start < limit_s:
      partial = [d for d in os.listdir(self.directory) if ".orbax-checkpoint-tmp" in d]
      for d in partial:
        shutil.rmtree(os.path.join(self.directory, d), ignore_errors=True)
      if partial:
        removed.update(partial)
        quiet = time.monotonic()
      time.sleep(0.05)
    return sorted(removed)

  def restore(self, step: int, abstract_items: dict, abstract_rng_key):
    """Restores the named items onto the shardings carried by their abstract trees; returns (items, key, meta)."""
    abstract_key_data = jax.eval_shape(jax.random.key_data, abstract_rng_key)
    key_data = np.zeros(abstract_key_data.shape, abstract_key_data.dtype)
    reader = local_reader(self.directory, (*abstract_items, "rng", "meta"))
    try:
      restored = reader.restore(
          step,
          args=ocp.args.Composite(
              **{k: ocp.args.StandardRestore(v) for k, v in abstract_items.items()},
              rng=ocp.args.StandardRestore({"key_data": key_data}),
              meta=ocp.args.JsonRestore()))
    finally:
      reader.close()
    key = jax.random.wrap_key_data(np.asarray(restored.rng["key_data"]), impl=jax.random.key_impl(abstract_rng_key))
    return {k: restored[k] for k in abstract_items}, key, restored.meta

  def restore_latest(self, abstract_items: dict, abstract_rng_key):
    """(step, items, key, meta) of the newest step that restores, or None without steps.

    A step that fails to restore is logged (step, path, error) and the next older one is tried.
    Once one restores, the newer unreadable steps are moved into `unreadable/` (kept for
    inspection, never deleted): Orbax refuses to save a step number that exists or is older than
    the latest, so left in place they would block every save up to their step. When no step
    restores nothing is moved (a changed model or config fails on every step alike) and a
    CheckpointError lists each step's error.
    """
    step, restored, failures = restore_newest(
        self.directory, self.manager.all_steps(), lambda s: self.restore(s, abstract_items, abstract_rng_key))
    if step is None:
      return None
    if failures:
      # Process 0 moves them once every process has read what it restores; the others find them moved.
      if distributed.is_main():
        for bad, _ in failures:
          moved = self._set_aside(bad)
          logging.warning("moved unreadable checkpoint step %d to %s (nothing deleted); resuming from step %d "
                          "at %s", bad, moved, step, self.step_path(step))
      distributed.barrier("unreadable checkpoint steps set aside")
      self.manager.reload()
    return (step, *restored)

  def step_path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def _set_aside(self, step: int) -> str:
    """Moves a step folder into unreadable/ under a free name; returns where it went."""
    aside = os.path.join(self.directory, UNREADABLE_DIR)
    os.makedirs(aside, exist_ok=True)
    dest, n = os.path.join(aside, str(step)), 1
    while os.path.exists(dest):
      n += 1
      dest = os.path.join(aside, f"{step}.{n}")
    os.rename(self.step_path(step), dest)
    return dest

  def wait(self):
    with self._surfaced():
      self.manager.wait_until_finished()
      self.manager.check_for_errors()

  def close(self):
    try:
      self.wait()
    finally:
      self.manager.close()


def restore_newest(directory: str, steps, restore):
  """(step, restore(step), failures) for the newest of `steps` that restores, (None, None, []) without steps.

  Each newer step that fails is logged (step, path, one-line error) and listed in `failures` as
  (step, summary); nothing on disk is changed here. CheckpointError, listing every step's error,
  when steps exist and none restores.
  """
  failures = []
  for step in sorted(agreement.steps_to_try(steps), reverse=True):
    path = os.path.join(directory, str(step))
    restored, failure = None, None
    try:
      with ORPHANED_READS.restoring(path):
        restored = restore(step)
    except Exception as e:  # pylint: disable=broad-except  # whatever broke this step, older ones may read
      failure = describe_failure(path, e)
    failure = agreement.restored_everywhere(step, failure)  # every process's read of it, or the first failure
    if failure:
      failures.append((step, failure))
      logging.warning("checkpoint step %d at %s does not restore: %s", step, path, failure)
      continue
    return step, restored, failures
  if failures:
    raise CheckpointError(
        f"no checkpoint in {directory} restores: " + "; ".join(f"step {s}: {why}" for s, why in failures)
        + " (nothing was changed). Repair or move those step folders, or train in a new --workdir")
  return None, None, []


def saved_steps(workdir: str) -> list[int]:
  """Finalised checkpoint steps of a run (Orbax writes into a temporary name and renames it when complete)."""
  directory = os.path.join(workdir, "checkpoints")
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit()) if os.path.isdir(directory) else []


def last_complete(workdir: str) -> tuple[int, str] | None:
  """(step, folder) of the newest checkpoint step of a run that reads as complete (`step_problem`), or None."""
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  for step in reversed(saved_steps(workdir)):
    if not step_problem(directory, step):
      return step, os.path.join(directory, str(step))
  return None


def resume_point(workdir: str) -> str:
  """Where a stopped run of `workdir` resumes from, as a line says it (`glmrl.runtime.peers`' end of a lost run)."""
  saved = last_complete(workdir)
  return (f"the last complete checkpoint is step {saved[0]} ({saved[1]})" if saved
          else "no checkpoint of this run is complete")


def restore_trained_params(workdir: str, like_states: dict, step: int | None = None):
  """({item: params state}, step) of the newest training checkpoint in `<workdir>/checkpoints` whose every item of
  `like_states` restores (of `step` alone when given: CheckpointError when it does not restore), or (None, None)
  without checkpoints: one step for every policy.

  Only those items (each policy's `Saved.params` or `Saved.ema`) are read, onto the shardings and dtypes of their
  `like_states`. An unreadable step is reported and the next older one tried; nothing is moved or changed (sampling
  and evaluation are read-only: the training run sets unreadable steps aside). CheckpointError when none restores.
  """
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  if not os.path.isdir(directory):
    return None, None
  manager = local_reader(directory, tuple(like_states))
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like_states)
  try:
    steps = manager.all_steps() if step is None else [step]
    step, restored, _ = restore_newest(
        directory, steps,
        lambda s: manager.restore(s, args=ocp.args.Composite(
            **{item: ocp.args.StandardRestore(tree) for item, tree in abstract.items()})))
  finally:
    manager.close()
  return (None, None) if step is None else ({item: restored[item] for item in like_states}, step)


def local_reader(directory: str, items: tuple[str, ...]) -> ocp.CheckpointManager:
  """A read-only manager of `directory` whose restores read this process's shards without Orbax's barriers
  across processes (the restore's agreement is `restore_newest`'s)."""
  me = jax.process_index()
  return ocp.CheckpointManager(directory, item_names=items, options=ocp.CheckpointManagerOptions(
      read_only=True, create=False, save_interval_steps=0,  # what read_only sets (with a warning otherwise)
      multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})))


def describe_failure(step_path: str, error: BaseException) -> str:
  """One line: the innermost error of the chain (TensorStore wraps the cause in a page-long spec),
  plus the PyTree items whose _METADATA is missing (Orbax then reports only a pytree mismatch)."""
  root, seen = error, {id(error)}
  while True:  # the chain Python would print (`raise ... from None` ends it)
    nxt = root.__cause__ or (None if root.__suppress_context__ else root.__context__)
    if nxt is None or id(nxt) in seen:
      break
    seen.add(id(nxt))
    root = nxt
  lines = str(root).strip().splitlines()
  summary = f"{type(root).__name__}: {lines[0] if lines else ''}".rstrip(": ")
  if len(summary) > _SUMMARY_CHARS:
    summary = summary[:_SUMMARY_CHARS - 3] + "..."
  missing = [os.path.join(item, "_METADATA") for item in ("params", "opt_state", "rng")
             if os.path.isdir(os.path.join(step_path, item))
             and not os.path.isfile(os.path.join(step_path, item, "_METADATA"))]
  if missing:
    summary = f"{', '.join(missing)} missing ({summary})"
  return summary


