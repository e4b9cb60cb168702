"""An offline OCR scorer: the text each image shows, read by PP-OCRv4 (PaddleOCR's detector and its Chinese
recogniser, which reads Latin script too) run with ONNX Runtime from the models the `rapidocr-onnxruntime` wheel
carries. Nothing is downloaded at run time.

    pip install -r requirements-ocr.txt && pip install --no-deps -r requirements-ocr-nodeps.txt
    python -m glmrl.rewards.server --scorer=glmrl.rewards.scorers.ocr:read --port=8001

serves {"texts": [...]} for the `text_accuracy`, `ocr_word_accuracy` and `ocr_ned` rewards and the `ocr`
benchmark. The engine is built when this module is imported (the server starts with it, or fails in one line).

Two reading rules, one scorer each:
- `read`: the recognitions of confidence >= `MIN_CONFIDENCE`, in reading order (`reading_order`);
- `read_flow_grpo`: Flow-GRPO's rule (flow_grpo/ocr.py `OcrScorer`): every recognition of confidence > 0, in the
  engine's order. Flow-GRPO runs PaddleOCR's English recogniser (`lang="en"`, downloaded by PaddleOCR at run time);
  no wheel on PyPI ships those weights for ONNX Runtime, so both rules read with the models above, and the numbers
  are comparable with Flow-GRPO's only as far as the two recognisers agree.

An image the engine cannot size (its resize fails: e.g. an 8 x 4096 strip) reads as nothing, logged in one line on
the server's stderr: that image scores as a failed read (Flow-GRPO's maximum penalty), the rest of the request its
own. Any other failure of the engine (a broken ONNX Runtime, missing model files) fails the request, and so does a
request none of whose images could be read: the server answers 500 naming the error, and the trainer's reward
fails, rather than every image reading as nothing and every group scoring zero.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

try:
  import cv2
  from rapidocr_onnxruntime import RapidOCR
  from rapidocr_onnxruntime.ch_ppocr_det import utils as det_utils
  from rapidocr_onnxruntime.utils import process_img
except ImportError as e:  # the server reports it in one line
  # opencv-python (what `pip install rapidocr-onnxruntime` pulls in) loads the system's libGL even with no screen;
  # the headless build requirements-ocr.txt installs needs none.
  install = "pip install -r requirements-ocr.txt && pip install --no-deps -r requirements-ocr-nodeps.txt"
  fix = f"pip uninstall -y opencv-python && {install}" if "libGL" in str(e) else install
  raise ImportError(f"the OCR scorer needs rapidocr-onnxruntime and OpenCV: {fix} ({e})") from None

# Recognitions below this confidence are dropped (a detector box over texture reads as noise).
MIN_CONFIDENCE = 0.5

# The detector sees the image at most 960 pixels on its longer side (PaddleOCR's default; rapidocr's own scales the
# shorter side up, which enlarges a wide render several times and slows its read as much, the same words read).
# Its text boxes are grown 2.0x their area-to-perimeter ratio (rapidocr 1.6): tightly set words then keep their
# spaces. The figures of both: docs/benchmarks.md, "Measurements behind the library's defaults".
_ENGINE = RapidOCR(det_limit_type="max", det_limit_side_len=960, det_unclip_ratio=2.0)
_LOCK = threading.Lock()  # one ONNX Runtime session pair, not documented as safe to share across threads
# What the engine raises for an image it cannot size (rapidocr wraps OpenCV's resize error in its own, in both of
# its resize steps): that image's failure alone. Anything else is the engine's.
UNREADABLE = (process_img.ResizeImgError, det_utils.ResizeImgError, cv2.error)


def reading_order(lines: list) -> list[str]:
  """Texts of (box [4 x (x, y)], text, confidence) detections of confidence >= MIN_CONFIDENCE in reading order: rows
  top to bottom (a box whose vertical centre lies within the previous box's height continues its row), each row left
  to right."""
  boxes = sorted(((np.asarray(box, np.float64), text) for box, text, conf in lines if conf >= MIN_CONFIDENCE),
                 key=lambda b: b[0][:, 1].mean())
  rows, last = [], None
  for box, text in boxes:
    centre, height = box[:, 1].mean(), np.ptp(box[:, 1])
    if last is not None and abs(centre - last[0]) <= max(last[1], height) / 2:
      rows[-1].append((box[:, 0].min(), text))
    else:
      rows.append([(box[:, 0].min(), text)])
    last = (centre, height)
  return [text for row in rows for _, text in sorted(row, key=lambda r: r[0])]


def flow_grpo_order(lines: list) -> list[str]:
  """Texts of (box, text, confidence) detections as Flow-GRPO keeps them: confidence > 0, in the engine's order."""
  return [text for _, text, conf in lines if conf > 0]


def detections(image: np.ndarray) -> list:
  """(box, text, confidence) of each text line the engine finds in one uint8 [H, W, 3] RGB image."""
  with _LOCK:
    # RapidOCR takes OpenCV's BGR order for arrays.
    lines, _ = _ENGINE(np.ascontiguousarray(image[..., ::-1]))
  return lines or []


def read_one(image: np.ndarray, rule=reading_order) -> str:
  """The text of one uint8 [H, W, 3] RGB image, the detections `rule` keeps joined by spaces ("" for none)."""
  return " ".join(rule(detections(image)))


def _read_all(images, rule) -> list[str]:
  out, unreadable = [], []
  for i, image in enumerate(images):
    image = np.asarray(image)
    try:
      out.append(read_one(image, rule))
    except UNREADABLE as e:  # this image's alone
      print(f"OCR: image {i} of the request ({image.shape[1]} x {image.shape[0]}) could not be read "
            f"({type(e).__name__}: {e}); it reads as nothing", file=sys.stderr, flush=True)
      unreadable.append(f"{image.shape[1]} x {image.shape[0]}")
      out.append("")
  if out and len(unreadable) == len(out):
    raise RuntimeError(f"OCR: none of the request's {len(out)} image(s) could be read (sizes {unreadable[:4]}): the "
                       "engine sizes no image it is given")
  return out


def read(images, prompts, metadata) -> list[str]:
  """The server's scorer: one reading per image (confidence >= MIN_CONFIDENCE, reading order)."""
  del prompts, metadata  # the reading is the image's alone
  return _read_all(images, reading_order)


def read_flow_grpo(images, prompts, metadata) -> list[str]:
  """The server's scorer with Flow-GRPO's reading rule: every recognition of confidence > 0, the engine's order."""
  del prompts, metadata
  return _read_all(images, flow_grpo_order)
