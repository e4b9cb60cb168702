"""W&B offline: what the run writer logs to TensorBoard reaches the W&B run too, read back from its files."""

import json

import ml_collections
import numpy as np
import pytest
from PIL import Image

from configs import demo
from glmrl.errors import UserError
from glmrl.logging import make_grid, run_writer, sample_captions
from glmrl.logging.wandb_run import WandbRun
from tests.logging import wandb_records


def _offline_config():
  config = demo.get_config()
  config.log.wandb, config.log.wandb_mode, config.log.wandb_name = True, "offline", "unit"
  return config


def test_scalars_and_grids_reach_an_offline_run_as_they_reach_metrics_jsonl(tmp_path):
  images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
  prompts, rewards = ["a", "b", "c", "d"], np.array([0.5, 1.0, -1.0, 0.25])
  with run_writer(tmp_path, _offline_config()) as w:
    w.write_scalars(1, {"reward/mean": 0.5, "loss": float("nan")})
    w.write_scalars(2, {"reward/mean": 0.75, "loss": 1.5})
    w.write_samples(2, images, prompts, rewards, ncols=2)
  rows = wandb_records.history(tmp_path)
  # As TensorBoard: every finite value at its step; the non-finite one only in metrics.jsonl (as null).
  assert [(r["_step"], r.get("reward/mean"), r.get("loss")) for r in rows if "reward/mean" in r] == \
         [(1, 0.5, None), (2, 0.75, 1.5)]
  assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["loss"] is None
  (grid,) = [r for r in rows if "samples/path" in r]
  assert grid["_step"] == 2
  (media,) = (tmp_path / "wandb").glob(f"offline-run-*/files/{grid['samples/path']}")
  np.testing.assert_array_equal(np.asarray(Image.open(media)), make_grid(images, sample_captions(prompts, rewards), 2))
  (run,) = wandb_records.runs(tmp_path)
  assert (run["id"], run["name"], run["project"]) == \
         ((tmp_path / "wandb" / "train_run_id").read_text().strip(), "unit", "glmrl")
  assert run["config"]["train"]["num_steps"] == demo.get_config().train.num_steps


def test_a_training_run_resumes_its_wandb_run_and_eval_starts_its_own(tmp_path):
  with run_writer(tmp_path, _offline_config()) as w:
    w.write_scalars(1, {"x": 1.0})
  with run_writer(tmp_path, _offline_config()) as w:  # the resumed training run
    w.write_scalars(2, {"x": 2.0})
  with run_writer(tmp_path, _offline_config(), job="eval") as w:
    w.write_scalars(0, {"eval/reward/mean": 0.1})
  ids = [r["id"] for r in wandb_records.runs(tmp_path)]
  train_id = (tmp_path / "wandb" / "train_run_id").read_text().strip()
  assert len(ids) == 3 and ids.count(train_id) == 2, ids
  assert sorted(r["_step"] for r in wandb_records.history(tmp_path) if "x" in r) == [1, 2]


def test_no_wandb_without_the_flag_and_a_run_that_cannot_start_is_one_line(tmp_path, monkeypatch):
  with run_writer(tmp_path / "plain", demo.get_config()) as w:
    w.write_scalars(1, {"x": 1.0})
  assert not (tmp_path / "plain" / "wandb").exists()
  # Online without an account or network: W&B's own error, in one line that names the way out.
  monkeypatch.setenv("WANDB_API_KEY", "")
  monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
  with pytest.raises(UserError, match="log.wandb: W&B did not start a run in mode 'online'.*wandb_mode=offline"):
    WandbRun(str(tmp_path / "online"), project="p", name="n", mode="online", job="train",
             config=ml_collections.ConfigDict({"a": 1}).to_dict())


def test_wandbs_environment_holds_where_the_config_leaves_a_setting_empty(tmp_path, monkeypatch):
  """WANDB_MODE=offline with the defaults: an offline run (no account asked for), in WANDB_PROJECT under WANDB_DIR,
  named WANDB_NAME; a value the config sets wins over its variable."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_PROJECT", "from_env")
  monkeypatch.setenv("WANDB_NAME", "env_name")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
  (tmp_path / "elsewhere").mkdir()
  monkeypatch.setenv("WANDB_API_KEY", "")
  monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # an online run would fail here
  config = demo.get_config()
  config.log.wandb = True
  assert (config.log.wandb_project, config.log.wandb_name, config.log.wandb_mode) == ("", "", "")
  work = tmp_path / "work"
  with run_writer(work, config) as w:
    w.write_scalars(1, {"x": 1.0})
  assert not list((work / "wandb").glob("*run-*"))  # W&B's files went to WANDB_DIR; the id file stays
  (run,) = wandb_records.runs(tmp_path / "elsewhere")
  assert (run["project"], run["name"]) == ("from_env", "env_name")
  assert run["id"] == (work / "wandb" / "train_run_id").read_text().strip()
  assert [r["x"] for r in wandb_records.history(tmp_path / "elsewhere") if "x" in r] == [1.0]

  config.log.wandb_project, config.log.wandb_name = "from_config", "config_name"
  with run_writer(tmp_path / "work2", config, job="eval") as w:
    w.write_scalars(0, {"y": 1.0})
  got = {(r["project"], r["name"]) for r in wandb_records.runs(tmp_path / "elsewhere")}
  assert got == {("from_env", "env_name"), ("from_config", "config_name")}
  monkeypatch.delenv("WANDB_DIR")
  config.log.wandb_mode = "online"  # the config's mode wins over WANDB_MODE=offline: online, and no account here
  with pytest.raises(UserError, match="W&B did not start a run in mode 'online'.*or WANDB_MODE=offline"):
    run_writer(tmp_path / "work3", config)


def test_an_online_run_without_an_account_is_refused_before_any_model(tmp_path, monkeypatch):
  """`main.py --config.log.wandb=True --config.log.wandb_mode=online` with no API key: W&B's login is checked with
  the inputs, so the line comes before any model is built (nothing compiled), and the workdir is left as it was."""
  from tests.cli import assert_one_line_error, main_in_process

  monkeypatch.setenv("WANDB_API_KEY", "")
  monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
  monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
  work = tmp_path / "run"
  for mode, flags in (("train", ()), ("eval", ("--config.eval.steps=0", "--config.eval.benchmark=parti:2"))):
    result = main_in_process("--config=configs/demo.py", f"--mode={mode}", "--config.log.wandb=True",
                             "--config.log.wandb_mode=online", *flags, tmp_path=work)
    assert_one_line_error(result, "log.wandb: W&B did not start a run in mode 'online' (UsageError: ")
    assert "--config.log.wandb_mode=offline (or WANDB_MODE=offline) logs without an account" in result.stderr
    assert "loading " not in result.stderr
    assert not work.exists()
