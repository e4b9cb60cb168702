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


def test_every_rows_quote_is_its_repositorys_line_and_its_value_follows_from_it():
  """configs/evidence/ holds the cited lines of each repository at its commit (docs/gen_recipe_evidence.py): each
  row's quote is its line there, and the value the quote's literal gives is the row's."""
  from configs import released
  gen = scripts.load("gen_recipe_evidence")
  checked = 0
  for algorithm, recipe in released.RECIPES.items():
    with open(gen.path(algorithm), encoding="utf-8") as f:
      text = f.read()
    assert gen.problems(recipe, text) == [], algorithm
    checked += sum(1 for row in recipe.settings if gen.ASSIGNMENT.match(row.quote))
  assert checked >= 45  # the rows that quote an assignment (of 63)


def test_a_row_off_its_quote_or_its_line_fails_the_check():
  import dataclasses
  from configs import released
  gen = scripts.load("gen_recipe_evidence")
  recipe = released.RECIPES["dgpo"]
  with open(gen.path("dgpo"), encoding="utf-8") as f:
    text = f.read()

  def with_row(what, **changes):
    rows = tuple(dataclasses.replace(r, **changes) if r.what == what else r for r in recipe.settings)
    return dataclasses.replace(recipe, settings=rows)

  assert gen.problems(with_row("sample.num_image_per_prompt", released=24), text) == [
      "configs/released.py: the dgpo row 'sample.num_image_per_prompt' says decoder.group_size=24, but its quote "
      "'config.sample.num_image_per_prompt = 16 # set to be 24 for better performance.' (config/dgpo.py:110) gives 16"]
  # A value read from its literal (DGPO's trunc_steps + 1), and a boolean against a number.
  assert len(gen.problems(with_row("trunc_steps (+ 1)", released=6), text)) == 1
  assert len(gen.problems(with_row("clip_dsm", released=1), text)) == 1
  moved = gen.problems(with_row("clip_range", where="config/dgpo.py:108"), text)
  assert len(moved) == 1 and "quotes 'config.clip_range = 1e-2'; config/dgpo.py:108 reads" in moved[0]
  assert gen.problems(dataclasses.replace(recipe, commit="abc1234"), text)[0].startswith(
      "configs/evidence/dgpo.txt is not of Luo-Yihong/DGPO at abc1234")
