"""Configs as data (glmrl/config/files.py): YAML and JSON mappings layered on configs/common.py or a named base
recipe, read once and faithfully (duplicate keys, YAML 1.2 numbers, JSON by a JSON parser, null, aliases), each
mistake one line at its file's line; a run's own config.json gives the run's config back, from any folder."""

import json
import os

import pytest

from configs import common, demo
from glmrl.config import keys
from glmrl.config import files as config_files
from glmrl.errors import UserError
from glmrl.train import resolved_config
from tests.cli import assert_one_line_error, completed, main_in_process


def test_nested_and_dotted_keys_layer_on_the_defaults(tmp_path):
  path = tmp_path / "run.yaml"
  path.write_text("# a partial recipe\nmodel:\n  preset: tiny\ntrain.num_steps: 7\noptim:\n  learning_rate: 1\n"
                  "decoder:\n  window_range: [0, 3]\nrewards:\n  - {name: brightness, weight: 1.0}\n")
  got = config_files.layered(str(path))
  want = common.base_config()
  want.model.preset, want.train.num_steps, want.optim.learning_rate = "tiny", 7, 1.0
  want.decoder.window_range, want.rewards = (0, 3), ({"name": "brightness", "weight": 1.0},)
  assert keys.leaves(got) == keys.leaves(want)
  assert isinstance(got.optim.learning_rate, float) and isinstance(got.decoder.window_range, tuple)
  assert json.loads(got.to_json_best_effort(sort_keys=True)) == json.loads(want.to_json_best_effort(sort_keys=True))


def test_a_runs_config_json_gives_the_run_back(tmp_path):
  """What `--config=<workdir>/config.json` loads: the resolved config, field for field and type for type (before,
  it was a NameError: 'false' is not defined)."""
  config = demo.get_config()
  config.train.num_steps = 3
  path = resolved_config.write(config, str(tmp_path))
  got = config_files.layered(path)
  assert keys.leaves(got) == keys.leaves(config)
  assert [type(v) for v in keys.leaves(got).values()] == \
      [type(v) for v in keys.leaves(config).values()]
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
    # Read faithfully: a key given twice (in any spelling), null, YAML 1.1's booleans, aliases, the base recipe.
    ("twice.yaml", "train:\n  num_steps: 3\nseed: 1\ntrain:\n  num_steps: 4\n",
     "twice.yaml:4: train is given twice, at lines 1 and 4: keep one"),
    ("spellings.yaml", "train.num_steps: 5\ntrain: {num_steps: 7}\n",
     "spellings.yaml:2: config.train.num_steps is given twice, at lines 1 and 2: keep one"),
    ("twice.json", '{"seed": 1,\n "seed": 2}', "twice.json:2: seed is given twice, at lines 1 and 2: keep one"),
    ("null.yaml", "seed: 0\ntrain:\n  num_steps: null\n", "null.yaml:3: config.train.num_steps: null, where the "
                                                            "default is 1000: give a value, or leave the key out"),
    ("yes.yaml", "model: {remat: yes}\n", "yes.yaml:1: config.model.remat='yes': a string (YAML 1.2, which glmrl "
                                          "reads); a boolean is true or false"),
    ("off.yaml", "log:\n  wandb_mode: off\n", "off.yaml:2: config.log.wandb_mode='off': must be one of"),
    ("section.yaml", "optim: 5\n", "section.yaml:1: config.optim is a section of keys (optim.b1, optim.b2, "
                                   "optim.eps, ...): give it a mapping of them"),
    ("bomb.yaml", "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)),
     "bomb.yaml:1: the file expands to more than 100000 values (aliases of aliases?)"),
    ("base.yaml", "base: configs/nothing.py\n", "base.yaml:1: base='configs/nothing.py': no such config file"),
])
def test_each_mistake_is_one_line_at_its_line(name, text, message, tmp_path):
  path = tmp_path / name
  path.write_text(text)
  with pytest.raises(UserError) as e:
    config_files.layered(str(path))
  assert str(e.value).startswith(f"{tmp_path}/{message}"), str(e.value)


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


def test_yaml_1_2_numbers_json_with_tabs_and_a_byte_order_mark_merge_keys_and_a_base_recipe(tmp_path):
  spelled = tmp_path / "lr.yaml"
  spelled.write_text("optim:\n  learning_rate: 1e-5\n  b2: 3E-4\nlog: {wandb_mode: disabled}\n")
  got = config_files.layered(str(spelled))
  assert (got.optim.learning_rate, got.optim.b2, got.log.wandb_mode) == (1e-5, 3e-4, "disabled")
  tabs = tmp_path / "tabs.json"
  tabs.write_bytes('\ufeff{\n\t"train": {\n\t\t"num_steps": 3\n\t},\n\t"optim": {"learning_rate": 2e-5}\n}'.encode())
  got = config_files.layered(str(tabs))
  assert (got.train.num_steps, got.optim.learning_rate) == (3, 2e-5)
  merged = tmp_path / "merge.yaml"
  merged.write_text("optim: &optim {learning_rate: 0.5, b1: 0.8}\ndecoder:\n  optim:\n    <<: *optim\n    b1: 0.7\n")
  got = config_files.layered(str(merged))
  assert (got.decoder.optim.learning_rate, got.decoder.optim.b1, got.optim.b1) == (0.5, 0.7, 0.8)
  based = tmp_path / "base.yaml"
  based.write_text("base: configs/demo.py\noptim: {learning_rate: 0.5}\n")
  want = demo.get_config()
  want.optim.learning_rate = 0.5
  assert keys.leaves(config_files.layered(str(based))) == keys.leaves(want)


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
  path = tmp_path / "latin.yaml"
  path.write_bytes(b"seed: 1\nname: caf\xe9\n")
  with pytest.raises(UserError, match=r"latin\.yaml:2: byte 0xe9 is not UTF-8 \(save the file as UTF-8\)$"):
    config_files.layered(str(path))


def test_main_names_the_users_file_never_the_loader(tmp_path):
  bad = tmp_path / "run.json"
  bad.write_text('{"train": {"num_steps": 3,}}')
  result = main_in_process(f"--config={bad}", tmp_path=tmp_path / "w1")
  assert_one_line_error(result, f"error: {bad}:1: Expecting property name enclosed in double quotes")
  result = main_in_process(f"--config={bad}:extra", tmp_path=tmp_path / "w2")
  assert_one_line_error(result, f"--config={bad}:extra: a YAML or JSON config takes no :argument")
  colon = tmp_path / "co:lon.yaml"
  colon.write_text("train: {num_stepz: 3}\n")
  result = main_in_process(f"--config={colon}", tmp_path=tmp_path / "w3")
  assert_one_line_error(result, f"{colon}:1: config.train.num_stepz is not a config key")


def test_a_file_of_only_its_changes_trains_and_a_file_based_on_the_runs_config_resumes_it(tmp_path):
  """A file of the demo's changes (its learning rate spelled 1e-5, its prompts file relative to the working
  directory) trains; the run's config.json holds that path absolute, and a tab-indented JSON file based on the
  run's config.py resumes it."""
  recipe = tmp_path / "run.yaml"
  recipe.write_text("base: configs/demo.py\noptim:\n  learning_rate: 1e-5\ntrain:\n  num_steps: 1\n"
                    "log:\n  image_interval: 0\ndata:\n  prompts_file: configs/data/demo_prompts.txt\n")
  workdir = tmp_path / "run"
  completed(f"--config={recipe}", tmp_path=workdir)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["optim"]["learning_rate"] == 1e-5 and os.path.isabs(saved["data"]["prompts_file"])
  tabs = tmp_path / "again.json"
  tabs.write_text(json.dumps({"base": str(workdir / "config.py"), "train": {"num_steps": 2}}, indent="\t"))
  completed(f"--config={tabs}", tmp_path=workdir)
  assert [r["step"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())] == [1, 2]
