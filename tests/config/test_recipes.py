"""A config built from a released recipe against its rows (`glmrl.config.recipes`): the variants themselves pass
silently, a flag that changes a row is one warning naming the row and the repository's value, another algorithm
under a variant is refused in one line (through main.py, as users pass it)."""

import pytest

from configs import demo_decoder, released
from glmrl.config import keys, recipes, validation
from glmrl.config.rules import ConfigError
from tests.cli import assert_one_line_error, main_in_process


@pytest.mark.parametrize("algorithm", sorted(released.RECIPES))
def test_a_variant_as_released_changes_no_row(algorithm):
  config = demo_decoder.get_config(algorithm)
  assert config.decoder.recipe == algorithm
  assert recipes.changed_rows(keys.leaves(config)) == []
  validation.validate(config)


def test_a_changed_row_is_one_line_naming_the_row_and_the_repositorys_value():
  config = demo_decoder.get_config("nft")
  config.decoder.ema.decay = 0.0
  assert recipes.changed_rows(keys.leaves(config)) == [
      "config.decoder.ema.decay=0.0 changes the released nft recipe's row 'decay_type 1: uphold' "
      "(NVlabs/DiffusionNFT@24af555 scripts/train_nft_sd3.py:177: 'uphold = 0.5'): the repository's value 0.5"]
  config = demo_decoder.get_config("dgpo")
  config.decoder.timestep_sharing = "image"
  config.decoder.group_size = 16  # the repository's own value, away from the demo's
  lines = recipes.changed_rows(keys.leaves(config))
  assert [line.split(" changes ")[0] for line in lines] == ["config.decoder.timestep_sharing='image'",
                                                            "config.decoder.group_size=16"]
  assert lines[0].endswith("the repository's value 'batch'")
  assert lines[1].endswith("the repository's value 16, the demo's 8")
  config.decoder.recipe = "sd3"
  with pytest.raises(ConfigError, match=r"config.decoder.recipe='sd3': must be '' or one of \['nft', 'awm', 'dgpo'\]"):
    recipes.changed_rows(keys.leaves(config))


def test_main_warns_of_a_changed_row_and_refuses_another_algorithm_under_a_variant(tmp_path):
  result = main_in_process("--config=configs/demo_decoder.py:dgpo", "--config.decoder.timestep_sharing=image",
                           "--config.data.prompts_file=missing.txt", tmp_path=tmp_path / "w1")
  assert_one_line_error(result, "config.data.prompts_file='missing.txt'")  # a later refusal: the warning came first
  warned = [line for line in result.stderr.splitlines() if "changes the released dgpo recipe's row" in line]
  assert len(warned) == 1 and "config.decoder.timestep_sharing='image'" in warned[0], result.stderr[-2000:]
  result = main_in_process("--config=configs/demo_decoder.py:nft", "--config.decoder.algorithm=flow_grpo",
                           tmp_path=tmp_path / "w2")
  assert_one_line_error(result, "config.decoder.algorithm='flow_grpo': config.decoder.recipe='nft' holds the rows "
                                "of NVlabs/DiffusionNFT's released 'nft' recipe")
