"""Reference reward server (standard library only) serving a pluggable scorer to `RemoteRewardClient`.

    python -m glmrl.rewards.server --scorer=glmrl.rewards.server:brightness --port=8000

Endpoints: POST /score (the protocol in `glmrl.rewards.remote`), GET /health. JSON only: the body
must be `Content-Type: application/json` and is parsed with `json` (never pickle); its size, the
image count, each image's side, the total pixel count and the prompt lengths are bounded (flags
below), and images must be base64 PNG, 8-bit RGB. Binds to 127.0.0.1 unless --host says otherwise;
there is no authentication, so only expose it on a trusted network.

The scorer is `module:function`, called as `fn(images, prompts, metadata)` with `images` a list of
uint8 [H, W, 3] numpy arrays, `prompts` a list of str and `metadata` a list of dicts (one per
image; what the client's `metadata_keys` selected). It returns one value per image, either

- numbers: a reward, answered as {"scores": [...]} (`brightness` below is an example), or
- strings: an OCR scorer, the text read from each image, answered as {"texts": [...]}; the
  `text_accuracy` reward compares them with the prompts' quoted texts. E.g. with PaddleOCR, join
  the recognised lines of an image into one string, as Flow-GRPO does; or
- lists: an object detector, each image's detections, answered as {"detections": [...]}: per image a list of
  {"class": str, "score": number, "box": [x0, y0, x1, y1], "color": str (optional)}; the `geneval` reward
  applies GenEval's rules to them (`glmrl.rewards.geneval`).

At most --workers scorer calls run at once (default 1: models are rarely thread-safe); decoding
runs in the request threads. A scorer exception or an output of the wrong shape is answered with
HTTP 500 and {"error": ...}, bad requests with 4xx.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import errno
import http.server
import importlib
import io
import json
import math
import re
import socket
import sys
import threading
from typing import Any, Callable

import numpy as np
from PIL import Image

from glmrl import errors
from glmrl.rewards.detections import check_detection

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclasses.dataclass(frozen=True)
class Limits:
  max_request_bytes: int = 64 * 2**20
  max_images: int = 64
  max_side: int = 4096
  max_total_pixels: int = 2**26   # decoded RGB pixels in one request (~200 MB), against PNG bombs
  max_prompt_chars: int = 4096

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"server limit {f.name}={v!r} must be a positive integer")


class BadRequest(ValueError):
  """An answer of HTTP `status`; `unread`: bytes of the body the client still sends (refused before reading)."""

  def __init__(self, status: int, message: str, unread: int = 0):
    super().__init__(message)
    self.status, self.unread = status, unread


def _reject_constant(name):
  raise ValueError(f"{name} is not valid JSON")


def decode_image(text: Any, i: int, limits: Limits) -> np.ndarray:
  """base64 PNG -> uint8 [H, W, 3], checking the header before decoding the pixels."""
  if not isinstance(text, str):
    raise BadRequest(400, f"images[{i}] must be a base64 string, got {type(text).__name__}")
  try:
    raw = base64.b64decode(text, validate=True)
  except (binascii.Error, ValueError) as e:
    raise BadRequest(400, f"images[{i}] is not valid base64 ({e})") from e
  if not raw.startswith(PNG_SIGNATURE):
    raise BadRequest(400, f"images[{i}] is not a PNG")
  try:
    with Image.open(io.BytesIO(raw), formats=["PNG"]) as img:
      w, h = img.size
      if max(w, h) > limits.max_side:
        raise BadRequest(400, f"images[{i}] is {w}x{h}, larger than max_side={limits.max_side}")
      if img.mode != "RGB":
        raise BadRequest(400, f"images[{i}] has PNG mode {img.mode!r}, expected 8-bit 'RGB'")
      img.load()
      return np.asarray(img, np.uint8).copy()
  except BadRequest:
    raise
  except Image.UnidentifiedImageError as e:  # its message quotes the in-memory file object
    raise BadRequest(400, f"images[{i}] could not be decoded (not a readable PNG: truncated or corrupt)") from e
  except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
    raise BadRequest(400, f"images[{i}] could not be decoded ({type(e).__name__}: {e})") from e


def _png_size(text: str) -> tuple[int, int] | None:
  """(width, height) from a base64 PNG's IHDR chunk, or None when it is not one (decode reports why)."""
  try:
    head = base64.b64decode(text[:44], validate=True)
  except (binascii.Error, ValueError, TypeError):
    return None
  if len(head) < 24 or not head.startswith(PNG_SIGNATURE) or head[12:16] != b"IHDR":
    return None
  return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def parse_request(body: bytes, limits: Limits) -> tuple[list[np.ndarray], list[str], list[dict]]:
  try:
    request = json.loads(body, parse_constant=_reject_constant)
  except (UnicodeDecodeError, ValueError) as e:
    raise BadRequest(400, f"body is not valid JSON ({e})") from e
  if not isinstance(request, dict):
    raise BadRequest(400, f"body must be a JSON object, got {type(request).__name__}")
  unknown = sorted(set(request) - {"images", "prompts", "metadata"})
  if unknown:
    raise BadRequest(400, f"unknown field(s) {unknown}; expected images, prompts, metadata")
  images, prompts = request.get("images"), request.get("prompts")
  if not isinstance(images, list) or not images:
    raise BadRequest(400, "images must be a non-empty list of base64 PNG strings")
  n = len(images)
  if n > limits.max_images:
    raise BadRequest(400, f"{n} images is more than max_images={limits.max_images}")
  if not isinstance(prompts, list) or len(prompts) != n or not all(isinstance(p, str) for p in prompts):
    raise BadRequest(400, f"prompts must be a list of {n} strings (one per image)")
  long = [i for i, p in enumerate(prompts) if len(p) > limits.max_prompt_chars]
  if long:
    raise BadRequest(400, f"prompts {long} are longer than max_prompt_chars={limits.max_prompt_chars}")
  metadata = request.get("metadata")
  if metadata is None:
    metadata = [{} for _ in range(n)]
  if not isinstance(metadata, list) or len(metadata) != n or not all(isinstance(m, dict) for m in metadata):
    raise BadRequest(400, f"metadata must be a list of {n} objects (one per image)")
  pixels = sum(w * h for w, h in filter(None, (_png_size(t) if isinstance(t, str) else None for t in images)))
  if pixels > limits.max_total_pixels:
    raise BadRequest(400, f"the images hold {pixels} pixels, more than max_total_pixels={limits.max_total_pixels}")
  return [decode_image(t, i, limits) for i, t in enumerate(images)], prompts, metadata


def format_output(values: Any, n: int) -> dict:
  """The scorer's output as {"scores": [...]}, {"texts": [...]} or {"detections": [...]}; ValueError if it is none
  of them."""
  if isinstance(values, np.ndarray):
    values = values.tolist()
  if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != n:
    raise ValueError(f"scorer must return {n} values (one per image), got {values!r:.200}")
  values = list(values)
  if all(isinstance(v, str) for v in values):
    return {"texts": values}
  if values and all(isinstance(v, (list, tuple)) for v in values):
    out = [[check_detection(d, f"output[{i}][{j}]") for j, d in enumerate(v)] for i, v in enumerate(values)]
    return {"detections": out}
  scores = []
  for i, v in enumerate(values):
    if isinstance(v, np.generic):
      v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      raise ValueError(f"scorer output[{i}] = {v!r:.100} is neither a finite number nor (with all others) a string")
    scores.append(float(v))
  return {"scores": scores}


class _Handler(http.server.BaseHTTPRequestHandler):
  server: "RewardServer"
  server_version = "glmrl-reward-server/1"
  timeout = 120  # seconds a connection may stall while sending its request
  DROP_BYTES = 2**31  # of a refused body, read and discarded at most
  DROP_WAIT_S = 5.0

  def log_message(self, format, *args):
    if self.server.verbose:
      super().log_message(format, *args)

  def _reply(self, status: int, payload: dict):
    if "error" in payload:  # for the client's user: no Python object's repr (a scorer's message may hold one)
      payload = {**payload, "error": _OBJECT_REPR.sub("an object", payload["error"])}
    body = json.dumps(payload).encode("utf-8")
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def do_GET(self):
    if self.path != "/health":
      self._reply(404, {"error": f"no such endpoint GET {self.path}; use GET /health or POST /score"})
      return
    self._reply(200, {"status": "ok", "scorer": self.server.scorer_name})

  def do_POST(self):
    try:
      images, prompts, metadata = self._read()
    except BadRequest as e:
      self.close_connection = True
      self._reply(e.status, {"error": str(e)})
      if e.unread:
        self._drop(e.unread)
      return
    try:
      with self.server.scoring:
        out = self.server.scorer(images, prompts, metadata)
      payload = format_output(out, len(images))
    except Exception as e:  # the scorer is user code: any failure is answered, never dropped
      self._reply(500, {"error": f"scorer {self.server.scorer_name} failed: {type(e).__name__}: {e}"})
      return
    self._reply(200, payload)

  def _read(self):
    if self.path != "/score":
      raise BadRequest(404, f"no such endpoint POST {self.path}; use POST /score")
    ctype = self.headers.get("Content-Type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
      raise BadRequest(415, f"Content-Type must be application/json, got {ctype!r}")
    length = self.headers.get("Content-Length")
    if length is None or not length.isdigit():
      raise BadRequest(411, f"a Content-Length header is required, got {length!r}")
    limits, n = self.server.limits, int(length)
    if n > limits.max_request_bytes:  # answered before any of the body is read (`do_POST` drops it after)
      raise BadRequest(413, f"request of {n} bytes is larger than max_request_bytes={limits.max_request_bytes}; "
                       "send fewer images per request (the client's chunk_size)", unread=n)
    body = self.rfile.read(n)
    if len(body) != n:
      raise BadRequest(400, f"body ended after {len(body)} of {n} bytes")
    return parse_request(body, limits)

  def _drop(self, n: int) -> None:
    """Reads and discards what the client still sends of a refused body (up to `n` bytes, `DROP_BYTES` at most,
    each read waiting `DROP_WAIT_S`): a socket closed with unread data is reset by the kernel, and a client still
    sending would see that reset instead of the answer it was sent."""
    self.wfile.flush()
    self.connection.settimeout(self.DROP_WAIT_S)
    left = min(n, self.DROP_BYTES)
    try:
      while left > 0 and (got := len(self.rfile.read1(min(2**20, left)))):
        left -= got
    except OSError:  # the client stopped sending (it read the answer) or stalled
      pass


class RewardServer(http.server.ThreadingHTTPServer):
  """One thread per request; scorer calls limited to `workers` at a time."""
  daemon_threads = True

  def __init__(self, scorer: Callable, *, host: str = "127.0.0.1", port: int = 0,
               limits: Limits = Limits(), workers: int = 1, verbose: bool = False,
               scorer_name: str | None = None):
    if not callable(scorer):
      raise ValueError(f"scorer {scorer!r} is not callable")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
      raise ValueError(f"workers={workers!r} must be a positive integer")
    self.scorer, self.limits, self.verbose = scorer, limits, verbose
    self.scorer_name = scorer_name or getattr(scorer, "__qualname__", repr(scorer))
    self.scoring = threading.BoundedSemaphore(workers)
    if ":" in host:
      self.address_family = socket.AF_INET6
    try:
      super().__init__((host, port), _Handler)
    except OSError as e:
      raise OSError(_bind_problem(host, port, e)) from None

  def handle_error(self, request, client_address):
    # A client that timed out and hung up is its own problem; anything else is printed as usual.
    if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
      if self.verbose:
        print(f"client {client_address} disconnected before its answer", file=sys.stderr)
      return
    super().handle_error(request, client_address)

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/score"


def _bind_problem(host: str, port: int, e: OSError) -> str:
  if e.errno == errno.EADDRINUSE:
    return f"--port={port}: in use on {host} (another server?): pick another port, or --port=0 for any free one"
  return f"cannot serve on --host={host} --port={port}: {e.strerror or e}"


def _positive_int(value: str) -> int:
  """argparse type of a count or size: a whole number >= 1."""
  if not value.strip().isdigit() or int(value) < 1:
    raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 1")
  return int(value)


def _megabytes(value: str) -> float:
  """argparse type of --max_request_mb: a finite number of MiB, at least one byte."""
  try:
    mb = float(value)
  except ValueError:
    mb = math.nan
  if not math.isfinite(mb) or mb * 2**20 < 1:
    raise argparse.ArgumentTypeError(f"{value!r} is not a finite number of MiB > 0 (e.g. 64)")
  return mb


def _port(value: str) -> int:
  """argparse type of --port: 0 (any free port) .. 65535, else one line naming the value."""
  if not value.isdigit() or int(value) > 65535:
    raise argparse.ArgumentTypeError(f"{value!r} is not a port: a number in 0..65535 (0: any free port)")
  return int(value)


def load_scorer(spec: str) -> Callable:
  """'package.module:function' -> the function."""
  module_name, sep, attr = spec.partition(":")
  if not sep or not module_name or not attr:
    raise ValueError(f"--scorer={spec!r} must be module:function, e.g. glmrl.rewards.server:brightness")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"--scorer={spec!r}: cannot import {module_name!r} ({e})") from e
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ValueError(f"--scorer={spec!r}: {module_name} has no callable {attr!r}")
  return fn


def brightness(images, prompts, metadata):
  """Example scorer: mean BT.601 luma in [0, 1], the built-in `brightness` reward per image."""
  from glmrl.rewards import image_stats

  return [float(image_stats.brightness(im[None], None, None)[0]) for im in images]


def main(argv=None) -> int:
  p = errors.ArgumentParser(prog="python -m glmrl.rewards.server", description=__doc__.splitlines()[0])
  p.add_argument("--scorer", required=True, help="module:function to serve")
  p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
  p.add_argument("--port", type=_port, default=8000, help="port (0: any free port, printed at start)")
  p.add_argument("--workers", type=_positive_int, default=1, help="scorer calls allowed at once")
  p.add_argument("--max_request_mb", type=_megabytes, default=Limits.max_request_bytes / 2**20,
                 help="largest request body, MiB")
  p.add_argument("--max_images", type=_positive_int, default=Limits.max_images, help="images per request at most")
  p.add_argument("--max_side", type=_positive_int, default=Limits.max_side, help="an image's largest side, pixels")
  p.add_argument("--max_total_pixels", type=_positive_int, default=Limits.max_total_pixels,
                 help="decoded pixels per request at most")
  p.add_argument("--verbose", action="store_true", help="log every request to stderr")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    # The address first: a busy port is one line before a scorer's (possibly slow) import.
    with socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET) as probe:
      try:
        probe.bind((args.host, args.port))
      except OSError as e:
        raise OSError(_bind_problem(args.host, args.port, e)) from None
    limits = Limits(max_request_bytes=int(args.max_request_mb * 2**20), max_images=args.max_images,
                    max_side=args.max_side, max_total_pixels=args.max_total_pixels)
    server = RewardServer(load_scorer(args.scorer), host=args.host, port=args.port, limits=limits,
                          workers=args.workers, verbose=args.verbose, scorer_name=args.scorer)
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.host not in _LOOPBACK:
    print(f"warning: serving on {args.host}, reachable from other machines; there is no authentication",
          file=sys.stderr)
  print(f"serving {args.scorer} on {server.url}", flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
