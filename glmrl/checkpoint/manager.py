"""Training checkpoints: `<workdir>/checkpoints/<step>/{params,opt_state,rng,meta}`.

`params` holds the whole AR generator's parameter state (trainable and frozen
parts, the same paths as a converted checkpoint), so `python -m
checkpoints_convert --to_hf --ckpt_dir=<workdir>` exports it; the generator's
HF config sits beside the steps as `ar_config.json`, and the converted folder
the run started from as `source.json` (the export takes every other pipeline
component from there). A LoRA run's `params` hold only its adapters; `lora.json`
records their settings and the identity of the base they adapt.

A step that does not restore (a truncated or missing file) is reported and
the newest step that does restore is used; the unreadable steps are moved,
untouched, into `checkpoints/unreadable/` (see `restore_latest`).
"""

import contextlib
import json
import logging as std_logging
import os
import shutil
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from glmrl.checkpoint import fingerprint as fingerprint_lib
from glmrl.errors import UserError
from glmrl.thread_errors import os_error_raised_in, quiet_os_errors

AR_CONFIG_FILE = "ar_config.json"
SOURCE_FILE = "source.json"
UNREADABLE_DIR = "unreadable"
# Longest error summary quoted per step (TensorStore messages embed whole specs).
_SUMMARY_CHARS = 400


class CheckpointError(UserError):
  """No step of a run's checkpoints folder restores; the message names the folder and each step's error."""


class CheckpointSaveError(UserError):
  """A checkpoint could not be written (a full disk, a folder gone): the run stops, its older steps intact."""


def write_text_atomic(path: str, text: str) -> None:
  """Writes through a temporary file and a rename, so a reader never sees half a file (process 0 of a
  multi-process run writes the run's records; the others hold the same values)."""
  if jax.process_index():
    return
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def write_json_atomic(path: str, value) -> None:
  """`value` as indented JSON, by `write_text_atomic`."""
  write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True))


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


def check_adapters(directory: str, adapters: dict | None, has_steps: bool, file: str, section: str) -> None:
  """The run's adapters (`{"rank", "alpha", "targets", "base": {"checkpoint_dir", "fingerprint"}}`, or
  None for full fine-tuning) must be those `directory`'s checkpoints were trained with: adapters never
  resume onto another base, and full fine-tuning and adapter checkpoints never mix. `file`: the policy's record
  (`glmrl.policy.base.Saved.adapters_file`); `section`: its LoRA settings' config path, for messages."""
  path = os.path.join(directory, file)
  recorded = None
  if os.path.isfile(path):
    with open(path) as f:
      recorded = json.load(f)
  if not has_steps or recorded == adapters:
    return
  if recorded is None:
    raise CheckpointError(f"{directory} holds full fine-tuning checkpoints but this run trains LoRA adapters "
                          f"({section}.rank > 0): use a new --workdir")
  if adapters is None:
    raise CheckpointError(f"{directory} holds LoRA adapter checkpoints ({path}: rank {recorded.get('rank')}) but "
                          f"this run is full fine-tuning ({section}.rank=0): set the same {section}, or use a "
                          "new --workdir")
  base, run_base = recorded.get("base") or {}, adapters.get("base") or {}
  # A fingerprint in the earlier, rounded-float form rounds differently from one CPU to another: such a base is
  # checked by its folder alone (and the record is rewritten in the exact form after this check).
  legacy = fingerprint_lib.is_legacy(base.get("fingerprint"))
  if base != run_base and not (legacy and base.get("checkpoint_dir") == run_base.get("checkpoint_dir")):
    raise CheckpointError(f"refusing to resume: the adapters in {directory} were trained on the base "
                          f"{recorded.get('base')} ({path}), this run's base is {adapters.get('base')}; "
                          "point config.model.checkpoint_dir at the base they were trained on, or use a new --workdir")
  if {**recorded, "base": None} == {**adapters, "base": None}:
    if legacy:
      logging.warning("%s records its base's fingerprint in the earlier, rounded-float form, whose rounding "
                      "differs between CPUs: the base is checked by its checkpoint_dir only (%s)", path,
                      base.get("checkpoint_dir"))
    return
  diff = sorted(k for k in set(recorded) | set(adapters) if recorded.get(k) != adapters.get(k))
  raise CheckpointError(f"{directory} holds adapters with other settings ({path}): "
                        + ", ".join(f"{k} {recorded.get(k)!r} there, {adapters.get(k)!r} here" for k in diff))


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
    _ORPHANED_READS.watch_saves(self.directory)
    for file, (record, _) in (adapters or {}).items():
      if record is not None:
        write_json_atomic(os.path.join(self.directory, file), record)

  def check_space(self, items: dict) -> None:
    """CheckpointSaveError, before any step runs, when the folder cannot hold one more checkpoint of `items`
    (this process's share of their bytes, and 5% for metadata)."""
    need = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(items)) / jax.process_count() * 1.05
    free = shutil.disk_usage(self.directory).free
    if free < need:
      raise CheckpointSaveError(f"{self.directory}: {free / 2**20:.1f} MiB free, a checkpoint takes about "
                                f"{need / 2**20:.1f} MiB: free space or choose another --workdir")

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
    with self._surfaced():
      self.manager.check_for_errors()
      return self.manager.save(step, args=args, force=force)

  @contextlib.contextmanager
  def _surfaced(self):
    """A failed save (here or in an earlier step's background write) as one CheckpointSaveError, its partial
    folder removed: the steps saved before stay as they were."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except  # whatever the write failed with
      partial = self._remove_partial()
      why = describe_failure(self.directory, e)
      if "No space left on device" in str(e):
        why = f"no space left on device ({why[:160]}...)"
      raise CheckpointSaveError(
          f"saving a checkpoint into {self.directory} failed: {why}; the run "
          f"stopped, steps {saved_steps(os.path.dirname(self.directory)) or 'none'} are intact"
          f"{' (removed the partial ' + ', '.join(partial) + ')' if partial else ''}; free space or fix the "
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
    restored = self.manager.restore(
        step,
        args=ocp.args.Composite(
            **{k: ocp.args.StandardRestore(v) for k, v in abstract_items.items()},
            rng=ocp.args.StandardRestore({"key_data": key_data}),
            meta=ocp.args.JsonRestore()))
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
    for bad, _ in failures:
      moved = self._set_aside(bad)
      logging.warning("moved unreadable checkpoint step %d to %s (nothing deleted); resuming from step %d "
                      "at %s", bad, moved, step, self.step_path(step))
    if failures:
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
  for step in sorted(steps, reverse=True):
    path = os.path.join(directory, str(step))
    try:
      with _ORPHANED_READS.restoring(path):
        restored = restore(step)
    except Exception as e:  # pylint: disable=broad-except  # whatever broke this step, older ones may read
      failures.append((step, describe_failure(path, e)))
      logging.warning("checkpoint step %d at %s does not restore: %s", step, path, failures[-1][1])
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


def restore_trained_params(workdir: str, like_state, item: str = "params", step: int | None = None):
  """(params state, step) of the newest training checkpoint in `<workdir>/checkpoints` that restores (of `step`
  alone when given: CheckpointError when it does not restore), or (None, None) without checkpoints.

  Only the `item` item (a policy's `Saved.params`) is read, onto the shardings and dtypes of `like_state`. An unreadable step
  is reported and the next older one tried; nothing is moved or changed (sampling and evaluation
  are read-only: the training run sets unreadable steps aside). CheckpointError when none restores.
  """
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  if not os.path.isdir(directory):
    return None, None
  manager = ocp.CheckpointManager(directory, item_names=(item,),
                                  options=ocp.CheckpointManagerOptions(read_only=True, create=False))
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like_state)
  try:
    steps = manager.all_steps() if step is None else [step]
    step, restored, _ = restore_newest(
        directory, steps,
        lambda s: manager.restore(s, args=ocp.args.Composite(**{item: ocp.args.StandardRestore(abstract)})))
  finally:
    manager.close()
  return (None, None) if step is None else (restored[item], step)


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


class _OrphanedReads:
  """Drops the stray errors of a failed restore's orphaned reads.

  Orbax closes its event loop on the first read error while TensorStore still completes the
  step's other reads; each completion then fails to reach the closed loop, or its coroutine is
  closed with the read error, or its future is collected unretrieved, and each prints a traceback
  (hundreds of lines for one truncated file), before and after the step has been reported.
  Dropped, while a restore runs or once one failed: 'Event loop is closed' errors (a live
  restore's loop is open, so they come from a failed one) and the errors and asyncio log records
  naming a step folder that is being restored or failed to. Anything else goes where it went
  before (so nothing changes for a run whose restores succeed).
  """

  def __init__(self):
    self.current: str | None = None  # the step folder being restored
    self.failed: set[str] = set()
    self.saving: set[str] = set()  # checkpoints folders being saved into (`TrainCheckpointer`)
    self.installed = False

  @contextlib.contextmanager
  def restoring(self, step_path: str):
    self._install()
    self.current = step_path.rstrip(os.sep) + os.sep
    try:
      yield
    except BaseException:
      self.failed.add(self.current)
      raise
    finally:
      self.current = None

  def watch_saves(self, directory: str) -> None:
    self._install()
    self.saving.add(directory)

  def _names_step(self, text: str) -> bool:
    # A failed background write names its step's temporary folder; the next save or close reports it in one line.
    if ".orbax-checkpoint-tmp" in text and any(d in text for d in self.saving):
      return True
    return any(p in text for p in (*self.failed, *([self.current] if self.current else [])))

  def _install(self):
    if self.installed:
      return
    self.installed = True
    previous = sys.unraisablehook

    def hook(unraisable):
      exc = unraisable.exc_value
      loop_closed = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
      if not ((loop_closed and (self.current or self.failed or self.saving)) or self._names_step(str(exc))):
        previous(unraisable)

    sys.unraisablehook = hook
    about_a_step = lambda r: self._names_step(r.getMessage() + str(r.exc_info[1] if r.exc_info else ""))
    orbax_os_error = lambda r: os_error_raised_in(r.exc_info[1] if r.exc_info else None, "orbax")
    # A write that failed on a full disk is also logged by asyncio ('Future exception was never retrieved') when
    # the run stops; it names no folder, only its OSError raised in Orbax.
    std_logging.getLogger("asyncio").addFilter(
        lambda r: not (about_a_step(r) or (self.saving and orbax_os_error(r))))
    # Orbax logs a failed background save from each of its threads and again when it is waited for, traceback
    # and all, before the next save or close reports it once (`TrainCheckpointer._surfaced`). Some of those
    # records name no folder (a full disk while writing a step's JSON metadata): their OSError identifies them.
    logging.get_absl_logger().addFilter(
        lambda r: not ("orbax" in r.pathname and self.saving and (
            about_a_step(r) or any(d in r.getMessage() for d in self.saving) or orbax_os_error(r))))


_ORPHANED_READS = _OrphanedReads()
