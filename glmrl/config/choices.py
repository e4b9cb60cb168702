"""The choices main.py's flags offer and the config's lists, named once and light to import: `python main.py --help`
and a mistyped flag import no model code (tests/config/test_choices.py)."""

MODES = ("train", "generate", "eval", "compile")
POLICIES = ("ar", "decoder", "ar+decoder")
# The parameter and compute dtypes a run takes (glmrl.models.glm_image.DTYPES, whose names these are).
DTYPES = ("float32", "bfloat16")
# The reward lists, each one value (a list of entries), not a section of keys.
REWARD_LISTS = ("rewards", "decoder.rewards")
