"""Configs as data (glmrl/config_files.py): YAML and JSON mappings layered on configs/common.py, each mistake one
line at its file's line; a run's own config.json gives the run's config back."""

import json

import pytest

from configs import common, demo
from glmrl import config_checks, config_files
from glmrl.errors import UserError
from glmrl.train import resolved_config
from tests.cli import assert_one_line_error, main_in_process


def test_nested_and_dotted_keys_layer_on_the_defaults(tmp_path):
  path = tmp_path / "run.yaml"
  path.write_text("# a partial recipe\nmodel:\n  preset: tiny\ntrain.num_steps: 7\noptim:\n  learning_rate: 1\n"
                  "decoder:\n  window_range: [0, 3]\nrewards:\n  - {name: brightness, weight: 1.0}\n")
  got = config_files.layered(str(path))
  want = common.base_config()
  want.model.preset, want.train.num_steps, want.optim.learning_rate = "tiny", 7, 1.0
  want.decoder.window_range, want.rewards = (0, 3), ({"name": "brightness", "weight": 1.0},)
  assert config_checks.leaves(got) == config_checks.leaves(want)
  assert isinstance(got.optim.learning_rate, float) and isinstance(got.decoder.window_range, tuple)
  assert json.loads(got.to_json_best_effort(sort_keys=True)) == json.loads(want.to_json_best_effort(sort_keys=True))


def test_a_runs_config_json_gives_the_run_back(tmp_path):
  """What `--config=<workdir>/config.json` loads: the resolved config, field for field and type for type (before,
  it was a NameError: 'false' is not defined)."""
  config = demo.get_config()
  config.train.num_steps = 3
  path = resolved_config.write(config, str(tmp_path))
  got = config_files.layered(path)
  assert config_checks.leaves(got) == config_checks.leaves(config)
  assert [type(v) for v in config_checks.leaves(got).values()] == \
      [type(v) for v in config_checks.leaves(config).values()]
  assert isinstance(got.rewards, tuple) and len(got.rewards) == len(config.rewards)
  assert json.loads(got.to_json_best_effort(sort_keys=True)) == json.loads(config.to_json_best_effort(sort_keys=True))


@pytest.mark.parametrize("name,text,message", [
    ("a.yaml", "train:\n  num_stepz: 3\n", "a.yaml:2: config.train.num_stepz is not a config key (did you mean "
                                          "config.train.num_steps?)"),
    ("b.yaml", "seed: 0\ntrain:\n  num_steps: -3\n", "b.yaml:3: config.train.num_steps=-3: must be >= 1"),
    ("c.yaml", "optim:\n  learning_rate: fast\n", "c.yaml:2: config.optim.learning_rate='fast': must be an integer or "
                                                 "a number, not str"),
    ("d.yaml", "train: [1\n", "d.yaml:2: expected ',' or ']', but got '<stream end>' (not valid YAML)"),
    ("e.json", '{"train": {"num_steps": 3,}}', "e.json:1: Expecting property name enclosed in double quotes (not "
                                               "valid JSON)"),
    ("f.json", '{\n  "sampling": {\n    "top_q": 1\n  }\n}', "f.json:3: config.sampling.top_q is not a config key "
                                                            "(did you mean config.sampling.top_p?)"),
    ("g.yaml", "- 1\n- 2\n", "g.yaml:1: expected a mapping of config keys"),
    ("h.yaml", "rewards: brightness\n", "h.yaml:1: config.rewards: must be a list of reward entries"),
])
def test_each_mistake_is_one_line_at_its_line(name, text, message, tmp_path):
  path = tmp_path / name
  path.write_text(text)
  with pytest.raises(UserError) as e:
    config_files.layered(str(path))
  assert str(e.value).startswith(f"{tmp_path}/{message}")


def test_main_takes_a_yaml_config_and_its_flags(tmp_path):
  """Through main.py's `__main__`: the file's mistake in one line before any work; a good file with a flag that
  breaks a rule between keys is checked as any config is (the file loaded, the flag applied on it)."""
  bad = tmp_path / "bad.yaml"
  bad.write_text("train:\n  num_stepz: 3\n")
  result = main_in_process(f"--config={bad}", tmp_path=tmp_path / "w1")
  assert_one_line_error(result, f"{bad}:2: config.train.num_stepz is not a config key")
  good = tmp_path / "good.yaml"
  good.write_text("model: {preset: tiny}\ndata: {prompts_file: configs/data/demo_prompts.txt}\n")
  result = main_in_process(f"--config={good}", "--config.grpo.group_size=1", tmp_path=tmp_path / "w2")
  assert_one_line_error(result, "config.grpo.group_size=1: must be at least 2")
  assert not (tmp_path / "w1").exists() and not (tmp_path / "w2").exists()
