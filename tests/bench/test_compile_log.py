"""bench/compile_log: a process started with it on PYTHONPATH logs each compilation it makes and, at its exit, the CPU
it used (and nothing without GLMRL_COMPILE_LOG); the summary counts a program compiled again by another process as a
repeat and adds up the CPU of the processes each test started."""

import os
import subprocess
import sys

from bench.compile_log import summarize
from tests.cli import ROOT, TIMEOUT_S

PROGRAM = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: x + 1)(jnp.ones(3)).sum())"


def _run(env: dict) -> None:
  done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True,
                        timeout=TIMEOUT_S, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "bench", "compile_log"),
                                                "JAX_PLATFORMS": "cpu", **env})
  assert done.returncode == 0 and done.stdout.split()[-1] == "6.0", done.stderr[-2000:]


def test_each_compilation_is_logged_with_its_program_and_layout(tmp_path):
  _run({"GLMRL_COMPILE_LOG": str(tmp_path / "log"), "JAX_ENABLE_COMPILATION_CACHE": "false"})
  records = summarize.load(str(tmp_path / "log"))
  mine = [r for r in records if r["name"] == "jit__lambda"]
  assert len(mine) == 1 and mine[0]["devices"] == 1 and mine[0]["processes"] == 1 and mine[0]["s"] > 0
  (cpu,) = summarize.load_cpu(str(tmp_path / "log"))
  assert cpu["cpu"] > 0 and cpu["argv"] == "-c" and cpu["pytest"] is False
  text = summarize.summary(records, 5, [cpu])
  assert "jit__lambda" in text and "CPU at exit (user + system): 1 processes" in text
  _run({"GLMRL_COMPILE_LOG": ""})  # off: nothing written anywhere
  assert len(list((tmp_path / "log").iterdir())) == 2


def test_a_program_compiled_again_counts_all_but_its_slowest_compilation():
  record = lambda s, processes=2: {"s": s, "name": "jit_update", "digest": "d1", "devices": 8, "processes": processes,
                                   "test": "tests/t.py::test_pod (call)", "argv": ""}
  records = [record(3.0), record(5.0), record(4.0), {**record(9.0), "digest": "d2"}, {**record(0.1), "digest": ""}]
  again = summarize.repeated_programs(records)
  assert list(again) == ["d1"] and summarize.repeats(again["d1"]) == 7.0
  text = summarize.summary(records, top=5)
  assert "21 s compiling" in text and "compiled again: 7 s (7 s in process groups)" in text
  assert "2 x 8: 5 programs, 21 s" in text and "tests/t.py::test_pod" in text


def test_the_cpu_of_the_processes_a_test_started_adds_up_apart_from_the_workers_own():
  cpu = [{"cpu": 30.0, "test": "tests/t.py::test_pod (call)", "argv": "main.py --process_id=0", "pytest": False},
         {"cpu": 32.0, "test": "tests/t.py::test_pod (call)", "argv": "main.py --process_id=1", "pytest": False},
         {"cpu": 400.0, "test": "", "argv": "-c", "pytest": True}]
  text = summarize.summary([], 5, cpu)
  assert "3 processes, 462 s; the 1 pytest processes' own: 400 s" in text
  assert "     62     2  tests/t.py::test_pod" in text
