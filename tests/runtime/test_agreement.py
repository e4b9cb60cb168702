"""glmrl/runtime/agreement.py: what the processes of a run decide together, in one process and across two real processes
(set up by `distributed.initialize` as main.py does, no model): a refusal, a crash, the stop step, the restored
step and the facts of a detected launch end alike in every process, naming the process."""

import json
import sys

import jax
import pytest

from glmrl.runtime import agreement
from glmrl.runtime import distributed
from glmrl.errors import UserError
from tests.cli import TIMEOUT_S
from tests.train.processes import env, free_port, run_processes


def test_one_process_decides_alone():
  agreement.refuse_together(None)
  with pytest.raises(UserError, match="^no such file$"):  # as it is: no process to name
    agreement.refuse_together("no such file")
  assert agreement.checked(lambda: 3) == 3
  with pytest.raises(ZeroDivisionError):  # a bug keeps its own exception
    agreement.checked(lambda: 1 / 0)
  assert agreement.stop_signal(None) is None and agreement.stop_signal("SIGINT") == ("SIGINT", 0)
  assert agreement.steps_to_try([3, 1]) == [3, 1]
  assert agreement.restored_everywhere(2, None) is None and agreement.restored_everywhere(2, "bad") == "bad"
  agreement.same_facts({"mode": "train"})


def _decisions(process_id: int, port: int) -> None:
  distributed.initialize(f"localhost:{port}", 2, process_id)
  me = jax.process_index()
  out = {}

  def outcome(fn):
    try:
      return fn()
    except UserError as e:
      return f"{type(e).__name__}: {e}"
    except ZeroDivisionError as e:
      return f"own {type(e).__name__}"

  out["refusal"] = outcome(lambda: agreement.refuse_together("no prompts file here" if me == 1 else None))
  out["both"] = outcome(lambda: agreement.refuse_together(f"problem {me}"))
  out["crash"] = outcome(lambda: agreement.checked(lambda: 1 / (me - 1)))
  out["passed"] = outcome(lambda: agreement.checked(lambda: f"result {me}"))
  out["stop"] = [agreement.stop_signal(None), agreement.stop_signal("SIGTERM" if me == 1 else None),
                 agreement.stop_signal("SIGINT" if me == 1 else "SIGTERM")]
  out["steps"] = agreement.steps_to_try([1, 2, 3] if me == 0 else [1, 2])
  out["restored"] = [agreement.restored_everywhere(3, "OUT_OF_RANGE" if me == 1 else None),
                     agreement.restored_everywhere(2, None)]
  facts = {"mode": "train", "workdir": "/w", "code": "c0de", "versions": {"jax": "0.10.2"}, "use_ema": me == 1,
           "config": {"seed": "0"}}
  out["facts"] = outcome(lambda: agreement.same_facts(facts))
  distributed.finished()
  print(json.dumps(out))


def test_two_processes_decide_together():
  port = free_port()
  outs = run_processes([[sys.executable, "-m", "tests.runtime.test_agreement", str(i), str(port)] for i in range(2)],
                       env(2), timeout=TIMEOUT_S)
  got = [json.loads(out.strip().splitlines()[-1]) for out in outs]
  for one in got:
    assert one["refusal"] == "Refusal: process 1: no prompts file here"
    assert one["both"] == "Refusal: process 0 (and 1 more process(es)): problem 0"
    assert one["passed"] in ("result 0", "result 1")
    assert one["stop"] == [None, ["SIGTERM", 1], ["SIGTERM", 0]]
    assert one["steps"] == [1, 2, 3]  # process 0's list, in every process
    assert one["restored"] == ["process 1: OUT_OF_RANGE", None]
    assert one["facts"] == ("Refusal: process 0: process 1 was started with --use_ema=True and process 0 with "
                            "--use_ema=False")
  # The crash keeps its own exception in its process (1 / 0 in process 1), one line in the other.
  assert got[1]["crash"] == "own ZeroDivisionError"
  assert got[0]["crash"] == ("Refusal: process 1: failed with ZeroDivisionError: division by zero (its traceback is "
                             "in its output)")


def test_an_salloc_shell_is_one_process(monkeypatch, caplog):
  for name in distributed.SLURM_TASK:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("SLURM_NTASKS", "4")
  monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
  with caplog.at_level("INFO"):
    assert not distributed.detected()
  assert "SLURM_NTASKS=4 but this process is no task of a job step (no SLURM_JOB_ID, SLURM_STEP_NODELIST, " \
         "SLURM_PROCID, SLURM_LOCALID): one process" in caplog.text
  for name, value in {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}.items():
    monkeypatch.setenv(name, value)
  assert distributed.detected()


if __name__ == "__main__":
  _decisions(int(sys.argv[1]), int(sys.argv[2]))
