"""docs/reference/config.md is generated from configs/common.py (docs/gen_config_reference.py): every key of
`configs.common.base_config()` has a comment there, and the committed page is what the script writes now."""

from tests.docs import scripts


def _generator():
  return scripts.load("gen_config_reference")


def test_every_key_has_a_comment_and_the_page_is_current():
  gen = _generator()
  page, missing = gen.render()
  assert not missing, f"configs/common.py: no comment for {['config.' + k for k in missing]}"
  with open(gen.OUT, encoding="utf-8") as f:
    assert f.read() == page, "docs/reference/config.md is stale: run python docs/gen_config_reference.py"
  keys = gen.defaults()
  assert len(keys) > 100 and all(f"| `{key}` |" in page for key in keys)


def test_comments_are_read_above_and_beside_a_key():
  gen = _generator()
  source = '''
def base_config():
  c = ml_collections.ConfigDict()
  # A block above,
  # two lines long.
  c.a = 1  # and one beside.
  c.b = 2

  # Not b's: a blank line between.
  c.section = ml_collections.ConfigDict()
  c.section.key = (  # spans lines
      3)
  c.section.bare = 4
  return c
'''
  found = {key: text for key, (_, text) in gen.comments(source).items()}
  assert found["a"] == "A block above, two lines long. and one beside."
  assert found["b"] == ""
  assert found["section"] == "Not b's: a blank line between."
  assert found["section.key"] == "spans lines"  # any line of a multi-line assignment
  assert found["section.bare"] == ""


def test_a_key_without_a_comment_fails_the_check(monkeypatch):
  gen = _generator()
  real = gen.comments
  monkeypatch.setattr(gen, "comments", lambda source: {**real(source), "seed": (9, "")})
  _, missing = gen.render()
  assert missing == ["seed"]
  assert gen.main(["--check"]) == 1
