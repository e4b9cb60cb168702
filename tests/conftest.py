"""Suite-wide settings: a persistent XLA compilation cache shared by the tests and their subprocesses.

Many tests build the same tiny models and compile the same programs (several trainers in the resume
test, subprocess runs); the cache turns their repeated compilations into loads.
"""

import ctypes.util
import os
import subprocess
import tempfile

import pytest

from tests import xdist_groups

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "glmrl_test_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# libtpu (requirements-compile.txt, for --mode=compile) takes /tmp/libtpu_lockfile in the first process that
# loads it; the suite's processes (pytest and its main.py subprocesses) load it side by side and none drives a
# TPU. Off Google Cloud it must not wait for the metadata server.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# jemalloc under the workers (started after this file is read) and every process they launch, where it is installed
# (.ci/run installs it): XLA:CPU's compiler makes and frees many small objects, and glibc's malloc took ~12% of a
# compiling launch's CPU time (perf); the suite took ~9% less wall time on jemalloc (docs/install.md, measurements
# in docs/benchmarks.md). Numerics do not depend on the allocator.
if "LD_PRELOAD" not in os.environ and (_jemalloc := ctypes.util.find_library("jemalloc")):
  os.environ["LD_PRELOAD"] = _jemalloc

from glmrl.runtime import gc_tuning  # noqa: E402  (after the settings above: glmrl imports JAX, which reads them)

gc_tuning.for_tracing()  # the workers trace as main.py does


@pytest.fixture(scope="session")
def tiny_released(shared_runs):
  """(hf_dir, converted_dir): a complete tiny GLM-Image folder in the released layout and its conversion by the
  command line (tests/fixtures/released_folder.py), made once per session; converted_dir is what
  --config.model.checkpoint_dir takes. Read only: a test that writes copies it."""
  from tests.fixtures.released_folder import write_converted

  root = shared_runs("tiny_released", write_converted)
  return root / "hf", root / "converted"


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
  """(name, make) -> the folder `make(folder)` filled, made once per session across pytest-xdist's workers
  (tests/shared_runs.py)."""
  from tests.shared_runs import SharedRuns

  return SharedRuns(tmp_path_factory)


@pytest.fixture
def small_disk(tmp_path):
  """mount(size) -> a fresh tmpfs of that size under tmp_path, unmounted after the test: a disk that fills for
  real. Mounting needs root (as on this project's machines); elsewhere the test is skipped."""
  mounted = []

  def mount(size: str):
    point = tmp_path / f"disk{len(mounted)}"
    point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                            capture_output=True, text=True)
    if result.returncode:
      pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    mounted.append(point)
    return point

  yield mount
  for point in mounted:
    subprocess.run(["umount", "--lazy", str(point)], check=False)  # detached even if a file there is still open


# The suite runs on two workers (`python -m pytest -n 2`, `--dist loadgroup`: the pod group goes to one worker
# first, as the largest unit). The other worker starts with the runs the pod tests compare with (`makes_reference`,
# tests/shared_runs.py), then the longest tests (main.py and multi-device subprocess runs), so that the many short
# ones fill in at the end and the workers finish together, instead of one worker running the slow tail alone while
# the other waits.
_LONG_FIRST = ("tests/train/", "tests/test_main.py", "tests/test_user_path.py", "tests/evaluation/test_compare_run.py")


def _order(item) -> int:
  if item.get_closest_marker("makes_reference"):
    return 0
  return 1 if item.nodeid.startswith(_LONG_FIRST) else 2


def pytest_collection_modifyitems(config, items):
  items.sort(key=_order)  # stable: file order kept within each part
  xdist_groups.write(config, items)


# `xdist_group` marks honoured under pytest 9 (tests/xdist_groups.py).
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
  xdist_groups.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  return xdist_groups.scheduler(config, log)


def pytest_unconfigure(config):
  xdist_groups.remove(config)
