"""The persistent compilation cache main.py turns on by default (glmrl/runtime/compilation_cache.py): a second run
of the same config loads every program the first compiled; a folder that cannot be written is one warning."""

import os

import jax

from glmrl.runtime import compilation_cache
from tests.cli import run_main


def test_a_second_run_loads_every_program_the_first_compiled(tmp_path):
  cache = tmp_path / "cache"
  flags = ("--config=configs/demo.py", "--mode=generate", "--config.grpo.group_size=2", f"--compilation_cache={cache}")
  first = run_main(*flags, tmp_path=tmp_path / "a")
  assert first.returncode == 0, first.stderr[-3000:]
  assert os.listdir(cache) == ["processes_1"]  # one folder per process count (`compilation_cache.layout_folder`)
  entries = set(os.listdir(cache / "processes_1"))
  assert len(entries) >= 3  # the sampler, the denoise + decode loop, the glyph encoder at least
  second = run_main(*flags, tmp_path=tmp_path / "b")
  assert second.returncode == 0, second.stderr[-3000:]
  assert set(os.listdir(cache / "processes_1")) == entries  # nothing compiled anew: every program was a cache hit


def test_where_the_cache_goes():
  assert compilation_cache.folder("/x") == "/x" and compilation_cache.folder("") == ""  # the flag wins; "" is off
  env = {k: v for k, v in os.environ.items()}
  try:
    os.environ[compilation_cache.ENV] = "/from/env"
    assert compilation_cache.folder(None) == "/from/env"
    del os.environ[compilation_cache.ENV]
    assert compilation_cache.folder(None) == os.path.join(os.path.expanduser("~"), ".cache", "glmrl", "jax")
  finally:
    os.environ.clear()
    os.environ.update(env)


def test_a_folder_that_cannot_be_written_is_one_warning_and_no_cache(tmp_path, caplog):
  (tmp_path / "file").write_text("")
  before = jax.config.jax_compilation_cache_dir
  try:
    assert compilation_cache.enable(str(tmp_path / "file" / "cache")) is None
    assert jax.config.jax_compilation_cache_dir is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"compilation cache off: cannot write {tmp_path}/file/cache/")
    assert compilation_cache.enable("") is None
    assert compilation_cache.enable(str(tmp_path / "ok")) == str(tmp_path / "ok" / "processes_1")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "ok" / "processes_1")
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
