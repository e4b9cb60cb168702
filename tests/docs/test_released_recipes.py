"""docs/reference/released_recipes.md is generated from configs/released.py and the decoder demo's own config
(docs/gen_released_recipes.py): the committed page is what the script writes now, and a demo value that leaves its
row (a released value, or the demo's own with its reason) fails the check."""

from tests.docs import scripts


def _generator():
  return scripts.load("gen_released_recipes")


def test_the_page_is_current_and_the_demo_follows_its_rows():
  gen = _generator()
  assert gen.drifted() == []
  with open(gen.OUT, encoding="utf-8") as f:
    assert f.read() == gen.render(), "docs/reference/released_recipes.md is stale: run python docs/gen_released_recipes.py"


def test_a_demo_value_off_its_row_fails_the_check(monkeypatch):
  gen = _generator()
  real = gen.demo_decoder.get_config

  def drifted_config(arg=None):
    c = real(arg)
    if arg == "dgpo":
      c.decoder.high_noise_steps = 10  # every step, not DGPO's trunc_steps + 1
    return c

  monkeypatch.setattr(gen.demo_decoder, "get_config", drifted_config)
  assert gen.drifted() == ["configs/demo_decoder.py:dgpo has config.decoder.high_noise_steps=10, its row in "
                           "configs/released.py 7"]
  assert gen.main(["--check"]) == 1


def test_every_deviation_says_why_and_every_key_exists():
  from configs import common
  from configs import released
  from glmrl.config import keys
  known = keys.leaves(common.base_config())
  for recipe in released.RECIPES.values():
    for s in recipe.settings:
      assert not s.deviates or s.why, (recipe.algorithm, s.what)
      assert s.key is None or s.key in known, s.key
