import json
import os
import re

import glmrl  # noqa: F401
import numpy as np
import pytest
from PIL import Image

from glmrl.data import check_image_size, load_image, load_prompts


def _png(path, h=40, w=24, seed=0, mode="RGB"):
  rng = np.random.default_rng(seed)
  channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
  arr = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
  Image.fromarray(arr[..., 0] if channels == 1 else arr, mode=mode).save(path)
  return arr


def _jsonl(path, rows):
  path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
  return str(path)


def test_txt_skips_blank_lines_and_keeps_line_numbers(tmp_path):
  p = tmp_path / "p.txt"
  p.write_text("a cat\n\n   \n  a dog on a sofa  \nlast")
  recs = load_prompts(p)
  assert [r.prompt for r in recs] == ["a cat", "a dog on a sofa", "last"]
  assert [r.line for r in recs] == [1, 4, 5]
  assert all(r.target_image is None and r.source_images == () and r.metadata == {} for r in recs)


def test_jsonl_all_fields_and_relative_paths(tmp_path):
  (tmp_path / "img").mkdir()
  _png(tmp_path / "img" / "t0.png")
  _png(tmp_path / "img" / "t1.png", seed=1)
  _png(tmp_path / "img" / "s.png", seed=2)
  p = _jsonl(tmp_path / "p.jsonl", [
      {"prompt": "one", "target_image": "img/t0.png", "source_images": ["img/s.png", "img/t1.png"],
       "metadata": {"score": 3, "tag": "x"}},
      "",
      {"prompt": "two", "target_image": str(tmp_path / "img" / "t1.png")},
  ])
  recs = load_prompts(p)
  assert [r.line for r in recs] == [1, 3]
  assert recs[0].target_image == str(tmp_path / "img" / "t0.png")
  assert recs[0].source_images == (str(tmp_path / "img" / "s.png"), str(tmp_path / "img" / "t1.png"))
  assert recs[0].metadata == {"score": 3, "tag": "x"}
  assert recs[1].target_image == str(tmp_path / "img" / "t1.png") and recs[1].source_images == ()


@pytest.mark.parametrize("rows,line,match", [
    (['{"prompt": "ok"}', '{"prompt": '], 2, "bad JSON"),
    (['["not", "an", "object"]'], 1, "expected a JSON object"),
    ([{"prompt": "ok"}, {"prompt": "x", "caption": "y"}], 2, r"unknown field\(s\) \['caption'\]"),
    ([{"prompt": "ok"}, "", {"metadata": {}}], 3, "missing required field 'prompt'"),
    ([{"prompt": 5}], 1, "'prompt' must be a string, got int"),
    ([{"prompt": "  "}], 1, "'prompt' is empty"),
    ([{"prompt": "a", "target_image": 3}], 1, "'target_image' must be a string path"),
    ([{"prompt": "a", "source_images": "good.png"}], 1, "'source_images' must be a list"),
    ([{"prompt": "a", "source_images": ["good.png", 7]}], 1, r"'source_images'\[1\] must be a string"),
    ([{"prompt": "a", "metadata": [1]}], 1, "'metadata' must be a JSON object"),
    ([{"prompt": "a", "metadata": {"target_image": 1}}], 1, "reserved"),
    ([{"prompt": "a"}, {"prompt": "b", "target_image": "missing.png"}], 2, "target_image 'missing.png' not found"),
    ([{"prompt": "a", "source_images": ["corrupt.png"]}], 1, r"source_images\[0\] 'corrupt.png' is not a readable"),
    ([{"prompt": "a", "target_image": "text.png"}], 1, "target_image 'text.png' is not a readable image"),
    ([{"prompt": "a", "target_image": "good.png"}, {"prompt": "b"}], 2, "'target_image' is missing here"),
    (['{"prompt": "a", "prompt": "b"}'], 1, r"key\(s\) \['prompt'\] given more than once"),
    (['{"prompt": "a", "metadata": {"tag": 1, "tag": 2}}'], 1, r"key\(s\) \['tag'\] given more than once"),
    ([{"prompt": "a cat\u0000 on a mat"}], 1, r"control character\(s\) '\\x00' \(first at character 5: 'a cat\\x00'\)"),
    ([{"prompt": "a", "source_images": ["img"]}], 1, r"source_images\[0\] 'img' is a folder"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, rows, line, match):
  _png(tmp_path / "good.png")
  (tmp_path / "img").mkdir()
  good = (tmp_path / "good.png").read_bytes()
  # Valid signature and header, damaged pixel data: only PIL's verify() notices.
  (tmp_path / "corrupt.png").write_bytes(good[:60] + bytes(b ^ 0xFF for b in good[60:120]) + good[120:])
  (tmp_path / "text.png").write_text("not an image")
  p = _jsonl(tmp_path / "bad.jsonl", rows)
  with pytest.raises(ValueError, match=re.escape(f"{p}:{line}: ") + ".*" + match):
    load_prompts(p)


@pytest.mark.parametrize("name,content,match", [
    ("empty.txt", "", "is empty"),
    ("blank.jsonl", "\n  \n\n", "is empty"),
    ("p.csv", "a,b", "unsupported prompt file extension '.csv'"),
])
def test_file_level_errors(tmp_path, name, content, match):
  p = tmp_path / name
  p.write_text(content)
  with pytest.raises(ValueError, match=re.escape(f"{p}: ") + ".*" + match):
    load_prompts(p)


def test_missing_prompt_file(tmp_path):
  with pytest.raises(ValueError, match="nope.txt: cannot read prompt file"):
    load_prompts(tmp_path / "nope.txt")


def test_invalid_utf8_names_line(tmp_path):
  p = tmp_path / "p.txt"
  p.write_bytes(b"fine\n\xff\xfe bad\n")
  with pytest.raises(ValueError, match=re.escape(f"{p}:2: not valid UTF-8")):
    load_prompts(p)


def test_load_image_resizes_to_uint8_rgb(tmp_path):
  arr = _png(tmp_path / "a.png", h=64, w=32)
  same = load_image(str(tmp_path / "a.png"), 64, 32)
  assert same.dtype == np.uint8 and same.shape == (64, 32, 3)
  np.testing.assert_array_equal(same, arr)  # no resampling when the size already matches
  resized = load_image(str(tmp_path / "a.png"), 32, 96)
  assert resized.dtype == np.uint8 and resized.shape == (32, 96, 3)
  _png(tmp_path / "g.png", mode="L")
  _png(tmp_path / "r.png", mode="RGBA")
  assert load_image(str(tmp_path / "g.png"), 32, 32).shape == (32, 32, 3)
  assert load_image(str(tmp_path / "r.png"), 32, 32).shape == (32, 32, 3)


@pytest.mark.parametrize("h,w,bad", [(100, 64, "height=100"), (64, 0, "width=0"), (64, 48.0, "width=48.0")])
def test_image_size_must_be_multiple_of_32(h, w, bad):
  with pytest.raises(ValueError, match=f"{bad} must be a positive multiple of 32"):
    check_image_size(h, w)


def test_relative_paths_resolve_against_the_file_not_cwd(tmp_path, monkeypatch):
  (tmp_path / "data").mkdir()
  _png(tmp_path / "data" / "t.png")
  p = _jsonl(tmp_path / "data" / "p.jsonl", [{"prompt": "a", "target_image": "t.png"}])
  monkeypatch.chdir(tmp_path)
  assert load_prompts(os.path.relpath(p))[0].target_image == str(tmp_path / "data" / "t.png")


def test_txt_prompts_keep_tabs_and_refuse_other_control_characters(tmp_path):
  (tmp_path / "p.txt").write_text("a\tcat\nan \x1b[31mowl\n")
  with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'p.txt'}:2: the prompt holds control character(s) "
                                                 "'\\x1b'")):
    load_prompts(tmp_path / "p.txt")
  (tmp_path / "p.txt").write_text("a\tcat\n")
  assert load_prompts(tmp_path / "p.txt")[0].prompt == "a\tcat"
