import pytest

from glmrl.models.ar import tokenizer
from glmrl.models.ar.config import ARConfig
from tests import shared_facts


def test_special_tokens_are_the_released_ones():
  assert tokenizer.SPECIAL_TOKENS == shared_facts.read_json("processor_tokenizer_special_tokens.json")


def test_word_tokenizer_maps_words_and_specials_to_model_ids():
  cfg = ARConfig.tiny()
  tok = tokenizer.word_tokenizer(cfg, tokenizer.words_of(["a red cat", "a 'sign'"]))
  ids = tok("a red cat <|image|>", add_special_tokens=False)["input_ids"]
  assert len(set(ids[:3])) == 3 and all(cfg.text.vision_vocab_size <= i < cfg.text.vocab_size for i in ids[:3])
  assert ids[3] == cfg.image_token_id
  assert tok.convert_tokens_to_ids(tokenizer.SPECIAL_TOKENS["bos_token"]) == cfg.image_start_token_id
  assert tok("zebra", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids("[UNK]")]


def test_too_many_words_is_a_clear_error():
  with pytest.raises(ValueError, match="free ids but the tokenizer needs"):
    tokenizer.vocabulary(ARConfig.tiny(), [f"w{i}" for i in range(500)])
