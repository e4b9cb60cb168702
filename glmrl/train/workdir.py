"""A run folder's layout: what each mode keeps there, checked before any model is built.

A name taken by the wrong kind of entry (a plain file where the run keeps a folder) would otherwise surface as a
traceback once the model is built, or, for `checkpoints`, read as "no steps".
"""

import os
import shutil

# name -> (is a folder, what the modes keep there)
LAYOUT = {
    "checkpoints": (True, "training checkpoints"),
    "samples": (True, "training sample grids"),
    "eval": (True, "evaluation reports and images"),
    "generate": (True, "generated images"),
    "metrics.jsonl": (False, "per-step metrics"),
    "wandb": (True, "W&B runs (config.log.wandb)"),
}


def layout_problem(workdir: str) -> str | None:
  """One line naming the first entry of `workdir` of the wrong kind, or None."""
  for name, (folder, what) in LAYOUT.items():
    path = os.path.join(workdir, name)
    if os.path.exists(path) and os.path.isdir(path) != folder:
      kind, want = ("folder", "file") if os.path.isdir(path) else ("file", "folder")
      return f"{path} is a {kind}; runs keep their {what} in a {want} of that name: move it away or pick another --workdir"
  return None


def not_a_run_folder(workdir: str) -> str | None:
  """One line when `workdir` is a folder of another kind that users pass for a run's by mistake (a checkpoint step
  of a run, an HF folder or export, a converted checkpoint), or None. Every mode would otherwise write its records
  into it: `--mode=eval` of a step folder evaluated the initial models there and exited 0."""
  if not os.path.isdir(workdir):
    return None
  flag = f"--workdir={workdir}"
  parent, name = os.path.split(os.path.normpath(os.path.abspath(workdir)))
  if os.path.exists(os.path.join(workdir, "_CHECKPOINT_METADATA")) or (
      name.isdigit() and os.path.basename(parent) == "checkpoints"):
    run = os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else "the run's folder"
    return (f"{flag} is a checkpoint (step {name}), not a run's folder: pass --workdir={run} (--mode=eval takes "
            f"the step as --config.eval.steps={name})")
  if name == "checkpoints" and any(d.isdigit() for d in os.listdir(workdir)):
    return f"{flag} is a run's checkpoints folder, not the run's folder: pass --workdir={parent}"
  for marker, what in (("model_index.json", "an HF pipeline folder"), ("adapter_config.json", "a PEFT adapter")):
    if os.path.exists(os.path.join(workdir, marker)):
      return (f"{flag} holds {what} ({marker}), not a run's folder: pass a run's --workdir (an HF folder is "
              "converted by python -m checkpoints_convert and named by config.model.checkpoint_dir)")
  converted = sorted(d for d in os.listdir(workdir) if d not in LAYOUT and os.path.isdir(os.path.join(workdir, d, "params")))
  if converted:
    return (f"{flag} holds a converted checkpoint ({converted[0]}/params), not a run's folder: name it with "
            "--config.model.checkpoint_dir and pass a folder of its own as --workdir")
  return None


def no_checkpoint_to_evaluate(workdir: str, eval_steps: str) -> str | None:
  """--mode=eval of the latest checkpoint (`config.eval.steps` empty) where the run has none: one line, else None.
  The initial models are evaluated only when asked for (step 0)."""
  from glmrl.checkpoint.manager import saved_steps  # pylint: disable=import-outside-toplevel  (orbax: once needed)

  if eval_steps or saved_steps(workdir):
    return None
  directory = os.path.join(workdir, "checkpoints")
  return (f"--mode=eval: {directory} holds no checkpoint to evaluate: pass a training run's --workdir, or "
          "--config.eval.steps=0 to evaluate the initial models")


def other_run_problem(workdir: str, config) -> str | None:
  """One line when `workdir`'s checkpoints were trained with other policies or LoRA settings than `config` (the
  run's `config.json`, written at each start, against this config), or None. Found here before any model is
  built; the policies' own checks after the build (`glmrl.checkpoint.adapters`, the base's fingerprint) stay."""
  import json  # pylint: disable=import-outside-toplevel

  from glmrl.checkpoint.manager import saved_steps  # pylint: disable=import-outside-toplevel
  from glmrl.policy.registry import SAVED  # pylint: disable=import-outside-toplevel
  from glmrl.train.resolved_config import JSON_FILE  # pylint: disable=import-outside-toplevel

  path = os.path.join(workdir, JSON_FILE)
  if not os.path.isfile(path) or not saved_steps(workdir):
    return None
  with open(path, encoding="utf-8") as f:
    recorded = json.load(f)

  def get(tree, key):
    for part in key.split("."):
      tree = tree.get(part) if hasattr(tree, "get") else None
    return list(tree) if isinstance(tree, (list, tuple)) else tree

  keys = ["train.policies"]
  for policy in str(config.train.policies).split("+"):
    section = SAVED[policy].lora_section.removeprefix("config.")
    if get(recorded, f"{section}.rank") or get(config, f"{section}.rank"):
      keys += [f"{section}.rank", f"{section}.alpha", f"{section}.targets"]
  for key in keys:
    theirs, ours = get(recorded, key), get(config, key)
    if theirs != ours:
      return (f"--workdir={workdir} holds checkpoints of a run with config.{key}={theirs!r} ({path}); this config "
              f"has {ours!r}: pass --config={path} (then your flags), or a new --workdir")
  return None


class AsFound:
  """A workdir's entries when a run started, so that a run ending before its first step finished (a refusal, a
  stop signal during the first compile) leaves the folder as it found it: `restore` removes what the run added (its
  records, event files, an empty metrics.jsonl; the folder itself when the run `created` it), from `start` until
  `keep` (a step finished: from then on the run's files are its record)."""

  def __init__(self, workdir: str, created: bool):
    self.workdir, self.created = workdir, created
    self.before = None
    self.kept = False

  def start(self) -> None:
    """Takes the snapshot, once the run holds the workdir (its lock): what another run adds is never removed."""
    self.before = set(os.listdir(self.workdir))

  def keep(self) -> None:
    self.kept = True

  def restore(self) -> None:
    if self.kept or self.before is None or not os.path.isdir(self.workdir):
      return
    for name in set(os.listdir(self.workdir)) - self.before:
      path = os.path.join(self.workdir, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        try:
          os.remove(path)
        except FileNotFoundError:  # another process of the run removed it first (a shared folder)
          pass
    if self.created and not os.listdir(self.workdir):
      os.rmdir(self.workdir)
