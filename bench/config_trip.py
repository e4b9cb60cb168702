"""The trip of a run's config through the library: the files it passes, and how often it returns to a higher floor
of the import graph, while `glmrl.train.loop.train` makes its run (until the first step) or runs one step.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/config_trip.py --config=configs/demo.py \\
        --config.mesh.fsdp=2 [--whole_step]

How it counts: a profile hook sees every call of a function in glmrl/ that takes the run's config (a ConfigDict
with `train` and `model` sections: the user's, or a copy) or its plan (`glmrl.programs.plan.RunPlan`) among its
arguments. The trip is the sequence of files such calls enter and, when they return, the files they return to
(consecutive repeats of one file count once). A module's floor is 0 when it imports no glmrl module, else one
more than the highest floor it imports (`tests/import_graph.py`: every import counts, also inside a function); a
return to a higher floor is a step of the trip from one file to a file of a higher floor.
Prints the counts and the trip, one file per line with its floor.
"""

from __future__ import annotations

import os
import sys
import tempfile

from absl import app
from absl import flags
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.import_graph import floors, graph, module_name  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(ROOT, "configs", "demo.py"), "the run's config")
_WHOLE_STEP = flags.DEFINE_bool("whole_step", False, "follow the config through the first step too")
_FLOORS_ROOT = flags.DEFINE_string("floors_root", ROOT, "the checkout whose import graph gives the floors (another "
                                   "checkout's, to count an older tree's trip on the present floors)")


class Trip:
  """The profile hook (see the module docstring)."""

  def __init__(self, plan_type, stop_at: str | None):
    self.plan_type, self.stop_at = plan_type, stop_at
    self.files: list[str] = []
    self.entered: set = set()  # frames of config-carrying calls not yet returned
    self.done = False

  def _carries(self, frame) -> bool:
    code = frame.f_code
    for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
      value = frame.f_locals.get(name)
      if isinstance(value, self.plan_type):
        return True
      if hasattr(value, "get") and type(value).__name__ == "ConfigDict" and "train" in value and "model" in value:
        return True
    return False

  def _see(self, path: str) -> None:
    name = os.path.relpath(path, ROOT)
    if not self.files or self.files[-1] != name:
      self.files.append(name)

  def __call__(self, frame, event, arg):
    if self.done or not frame.f_code.co_filename.startswith(os.path.join(ROOT, "glmrl")):
      return
    if event == "call":
      if self.stop_at and frame.f_code.co_qualname == self.stop_at:
        self.done = True
        return
      if self._carries(frame):
        self.entered.add(frame)
        self._see(frame.f_code.co_filename)
    elif event == "return" and frame in self.entered:
      self.entered.discard(frame)
      caller = frame.f_back
      while caller is not None and not caller.f_code.co_filename.startswith(os.path.join(ROOT, "glmrl")):
        caller = caller.f_back
      if caller is not None:
        self._see(caller.f_code.co_filename)


def returns_up(levels: list[int]) -> int:
  """How many steps of a trip through files of `levels` go to a higher floor."""
  return sum(b > a for a, b in zip(levels, levels[1:]))


def main(argv):
  del argv
  from glmrl.programs.plan import RunPlan  # pylint: disable=import-outside-toplevel  (after the platform choice)
  from glmrl.train import loop  # pylint: disable=import-outside-toplevel
  assert loop.__file__.startswith(ROOT), f"glmrl is imported from {loop.__file__}, not {ROOT}"

  config = _CONFIG.value
  with config.unlocked():
    config.train.num_steps = 1
  trip = Trip(RunPlan, None if _WHOLE_STEP.value else "Trainer.step")
  with tempfile.TemporaryDirectory() as workdir:
    sys.setprofile(trip)
    try:
      loop.train(config, os.path.join(workdir, "run"))
    finally:
      sys.setprofile(None)
  floor = floors(graph(_FLOORS_ROOT.value))
  levels = [floor[module_name(os.path.join(ROOT, f))] for f in trip.files]
  ups = returns_up(levels)
  for name, level in zip(trip.files, levels):
    print(f"{level:3d}  {name}")
  print(f"{len(trip.files)} files on the trip ({len(set(trip.files))} distinct), {ups} returns to a higher floor "
        f"({'through the first step' if _WHOLE_STEP.value else 'until the first step'})")


if __name__ == "__main__":
  app.run(main)
