"""A tiny vision-language model folder for `transformers serve` (tests/rewards/test_vlm_judge_served.py), built
offline with transformers' own constructors: a Llava (a 1-layer CLIP vision tower on 32 x 32 images, a 1-layer Llama)
with a WordLevel tokenizer of 35 tokens, a chat template and a PIL CLIP image processor.

Its weights are random except a hand-set path that fixes its greedy answer, whatever the image and question: the
attention and MLP outputs are zeroed, so each position's hidden state is its token's (one-hot) embedding, and the
output layer maps every token to `ANSWER` and `ANSWER` to the end of text."""

import os

ANSWER = "7"
_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
_WORDS = [str(d) for d in range(10)] + ["USER", "ASSISTANT", ":", ".", ",", "?", "Rate", "this", "image", "from",
                                        "to", "Answer", "with", "one", "digit", "the", "a", "is", "what", "\n"]
_VOCAB = _SPECIALS + _WORDS
_HIDDEN = 64
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<image> {% elif item['type'] == 'text' %}{{ item['text'] }} {% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] != 'user' %}</s>{% endif %} "
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}")

# `transformers serve` with nothing reaching the network (the command line checks PyPI for updates otherwise).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
               "OMP_NUM_THREADS": "1"}


def build(folder) -> str:
  """Writes the model and its processor to `folder`; returns its answer."""
  import torch
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, GenerationConfig, LlamaConfig, LlavaConfig,
                            LlavaForConditionalGeneration, LlavaProcessor, PreTrainedTokenizerFast)

  assert len(_VOCAB) <= _HIDDEN  # one-hot embeddings
  os.makedirs(folder, exist_ok=True)
  vocab = {t: i for i, t in enumerate(_VOCAB)}
  words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
  words.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
  words.decoder = decoders.WordPiece(prefix="##")
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                      pad_token="<pad>", extra_special_tokens={"image_token": "<image>"},
                                      model_max_length=512)
  tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
  processor = LlavaProcessor(
      image_processor=CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                            do_center_crop=True),
      tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default", chat_template=_CHAT_TEMPLATE,
      image_token="<image>", num_additional_image_tokens=1)
  vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            image_size=32, patch_size=8, projection_dim=32)
  text = LlamaConfig(vocab_size=len(_VOCAB), hidden_size=_HIDDEN, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                     bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"], pad_token_id=vocab["<pad>"],
                     tie_word_embeddings=False)
  config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=vocab["<image>"],
                       projector_hidden_act="gelu", vision_feature_select_strategy="default", vision_feature_layer=-1,
                       tie_word_embeddings=False)
  torch.manual_seed(0)
  model = LlavaForConditionalGeneration(config).eval()
  lm = model.model.language_model
  answer, end = vocab[ANSWER], vocab["</s>"]
  with torch.no_grad():
    for layer in lm.layers:
      layer.self_attn.o_proj.weight.zero_()
      layer.mlp.down_proj.weight.zero_()
    lm.norm.weight.fill_(1.0)
    lm.embed_tokens.weight.zero_()
    lm.embed_tokens.weight[:, :len(_VOCAB)] = torch.eye(len(_VOCAB))
    head = model.lm_head.weight
    head.zero_()
    head[answer, :] = 1.0  # every token -> the answer ...
    head[answer, answer] = 0.0
    head[end, answer] = 1.0  # ... and the answer -> the end of text
  model.generation_config = GenerationConfig(bos_token_id=vocab["<s>"], eos_token_id=end, pad_token_id=vocab["<pad>"],
                                             do_sample=False)
  model.save_pretrained(folder)
  processor.save_pretrained(folder)
  return ANSWER
