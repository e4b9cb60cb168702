"""glmrl/runtime/distributed.py across processes: two processes x 4 CPU devices, set up by `distributed.initialize` as
main.py does, dispatch independent programs with cross-process all-reduces back to back, jitted and compiled ahead
of time. Without `one_program_at_a_time` the processes run them in different orders over gloo and hang (2 of 2
launches past 100 s, where these finish in about 10 s; the compiled ones without their part of the patch, past
120 s) or abort on a size mismatch. The persistent compilation cache stays off there
(`compilation_cache.shared_by_processes`): nothing is written to the folder main.py would give it. The processes
tell a folder they share from one each has to itself (`compilation_cache.seen_by_every_process`, the check behind
the warning of a pod whose hosts each cache on their own disk), and resolve `auto` to one layout when their
devices report different memory."""

import json
import os
import sys

import jax
import pytest

from glmrl.runtime import distributed
from glmrl.errors import UserError
from tests.cli import TIMEOUT_S
from tests.train.processes import env, free_port, run_processes


def _programs(process_id: int, port: int, cache: str) -> None:
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel

  from glmrl.runtime import compilation_cache  # pylint: disable=import-outside-toplevel

  distributed.initialize(f"localhost:{port}", 2, process_id)
  assert compilation_cache.enable(cache) is None
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # every program would be written
  mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  # Four arrays of different sizes: a mixed-up pair of all-reduces shows as a size mismatch or a wait.
  xs = [jax.make_array_from_callback((8, n), NamedSharding(mesh, P("d")), lambda i, n=n: np.ones((1, n), np.float32))
        for n in (3, 1000, 17, 50000)]
  fns = [jax.jit(lambda a, k=k: jnp.sum(jnp.tanh(a * (k + 1)), axis=0), out_shardings=NamedSharding(mesh, P()))
         for k in range(4)]
  compiled = [f.lower(x).compile() for f, x in zip(fns, xs)]  # ahead of time: another dispatch path
  for programs in (fns, compiled):
    outs = []
    for _ in range(100):
      outs += [f(x) for f, x in zip(programs, xs)]  # no data between them: free to run at once
    for k, out in enumerate(outs[-4:]):
      np.testing.assert_allclose(np.asarray(out), 8 * np.tanh(k + 1.0), rtol=1e-6)
  own, shared = f"{cache}_of_process_{process_id}", f"{cache}_shared"
  for folder in (own, shared):
    os.makedirs(folder, exist_ok=True)
  seen = {"own": compilation_cache.seen_by_every_process(own), "shared": compilation_cache.seen_by_every_process(shared),
          "ar_weights": _auto_with_other_memory(process_id)}
  distributed.finished()
  print(json.dumps(seen))


def _auto_with_other_memory(process_id: int) -> dict:
  """The demo's `rollout.ar_weights=auto` where process 0's devices report 1 TiB and process 1's just its resident
  state (room for no generator copy): what each process's own memory picks, and what the run resolves."""
  from configs import demo  # pylint: disable=import-outside-toplevel
  from glmrl import sharding  # pylint: disable=import-outside-toplevel
  from glmrl.runtime import device_memory
  from glmrl.programs import abstract, auto  # pylint: disable=import-outside-toplevel
  from glmrl.train import setup  # pylint: disable=import-outside-toplevel

  config = demo.get_config()
  mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  run = abstract.build(config, mesh, "cpu", 2 ** 40)
  own = 2 ** 40 if process_id == 0 else sum(run.resident_bytes().values())
  device_memory.limit_bytes = lambda: own
  return {"own": auto.ar_weights(config, mesh, lambda: run, own).value,
          "run": setup.make_plan(config, mesh, setup.device_memory_bytes()).config.rollout.ar_weights}


def test_independent_programs_across_processes_on_cpus_run_one_at_a_time_without_the_compilation_cache(tmp_path):
  port, cache = free_port(), tmp_path / "cache"
  outs = run_processes([[sys.executable, "-m", "tests.runtime.test_distributed", str(i), str(port), str(cache)]
                        for i in range(2)], {**env(4), "JAX_COMPILATION_CACHE_DIR": str(cache)}, timeout=TIMEOUT_S)
  assert not cache.exists()
  seen = [json.loads(out.strip().splitlines()[-1]) for out in outs]
  # Each process's own memory would pick another layout; the run picks the one that fits the smaller.
  assert seen == [{"own": False, "shared": True, "ar_weights": {"own": "gathered", "run": "update"}},
                  {"own": False, "shared": True, "ar_weights": {"own": "update", "run": "update"}}], seen
  assert not [p for p in tmp_path.rglob(".shared_probe_*")]  # process 0 removes its probe


@pytest.mark.parametrize("stub", ["renamed internal", "other version", "renamed method"])
def test_another_jax_than_the_patch_was_written_for_is_one_clear_error(monkeypatch, stub):
  from jax._src import pjit  # pylint: disable=import-outside-toplevel

  if stub == "renamed internal":
    monkeypatch.delattr(pjit, "_get_fastpath_data")
    message = r"need jax==0\.10\.2 .*, without jax\._src\.pjit\._get_fastpath_data$"
  elif stub == "renamed method":
    from jax._src.interpreters import pxla  # pylint: disable=import-outside-toplevel

    monkeypatch.delattr(pxla.MeshExecutable, "create_cpp_call")
    message = r", without MeshExecutable\.create_cpp_call$"
  else:
    monkeypatch.setattr(jax, "__version__", "0.11.0")
    message = r"^several processes on CPUs need jax==0\.10\.2 \(requirements\.txt\), .*this is jax 0\.11\.0$"
  with pytest.raises(UserError, match=message):
    distributed.one_program_at_a_time()


if __name__ == "__main__":
  _programs(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
