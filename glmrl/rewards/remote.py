"""HTTP JSON client for rewards served elsewhere (OCR, VLM judges, models with other dependencies).

Protocol (what `glmrl.rewards.server` serves), one POST per chunk of the batch:

    request:  {"images": [base64 PNG, ...], "prompts": [str, ...], "metadata": [{...}, ...]}
    response: 200 {"scores": [float, ...]}  or  200 {"texts": [str, ...]}  (one per image)
              4xx / 5xx {"error": "what went wrong"}

A batch is split into chunks of `chunk_size` images sent by up to `max_workers` threads. Each chunk
is retried on connection errors, timeouts and HTTP 408/429/5xx, waiting backoff_s * 2**attempt
(capped at max_backoff_s) between attempts. Anything else fails the step: other 4xx answers, a
malformed 200 answer (not JSON, missing key, wrong count or type, non-finite score) and a chunk
still failing after `retries` retries raise `RemoteRewardError` naming the server, the images and
what was wrong. There is no fallback score.

`timeout_s` bounds each socket operation (connect, and each read of the answer), not the request
as a whole. Each retry is one warning line.

Every reward built on this client checks its server before any model is built (`probe`): one request
of one tiny image, answered and parsed as in training, with a shorter timeout per attempt.

Registered reward `remote` (host-side, model-backed: the client is built once from the config):

    {"name": "remote", "weight": 1.0, "kwargs": {"url": "http://127.0.0.1:8000/score"}}

Other names for other servers: `register_factory("my_judge", remote_reward_factory, pure_jax=False)`.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import http.client
import io
import json
import math
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Sequence

import numpy as np
from absl import logging
from PIL import Image

from glmrl.errors import UserError
from glmrl.rewards.registry import check_images, first_row, register_factory
from glmrl.rewards.detections import check_detection

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Each attempt of the start-up check (`probe`) waits this long at most: a run learns of a server that never
# answers before it builds its models, not minutes into its first step.
PROBE_TIMEOUT_S = 20.0
# The server's error text quoted in our errors is cut here so a huge HTML error page stays readable.
_QUOTE_CHARS = 500


class RemoteRewardError(UserError):
  """A reward server failed or answered something unusable; the training step must not go on. Reported as one
  line, like bad input: the message names the server and what it answered."""


class _Retryable(Exception):
  pass


def encode_png(image: np.ndarray, compress_level: int = 1) -> str:
  """uint8 [H, W, 3] -> base64 PNG text (compress level 1: fast, and PNG stays lossless)."""
  buf = io.BytesIO()
  Image.fromarray(np.ascontiguousarray(image), mode="RGB").save(buf, format="PNG",
                                                                compress_level=compress_level)
  return base64.b64encode(buf.getvalue()).decode("ascii")


def _jsonable(value, where: str):
  if isinstance(value, np.ndarray) or isinstance(value, np.generic):
    value = value.tolist()
  try:
    json.dumps(value, allow_nan=False)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where} is not JSON-serialisable ({e})") from e
  return value


def metadata_rows(metadata: Mapping[str, Any] | None, keys: Sequence[str], batch: int) -> list[dict]:
  """Per-image metadata dicts holding `keys` (each metadata[key] a length-`batch` sequence)."""
  rows = [{} for _ in range(batch)]
  for key in keys:
    if not metadata or key not in metadata:
      have = sorted(metadata) if metadata else []
      raise ValueError(f"remote reward sends metadata[{key!r}], which is missing; metadata has keys {have}")
    value = metadata[key]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != batch:
      raise ValueError(f"metadata[{key!r}] must hold one value per image ({batch}), got {value!r:.200}")
    for i in range(batch):
      rows[i][key] = _jsonable(value[i], f"metadata[{key!r}][{i}]")
  return rows


@dataclasses.dataclass(frozen=True)
class Retrying:
  """POSTs JSON to `url`, retried on connection errors, timeouts and HTTP 408/429/5xx (backoff_s * 2**attempt,
  at most max_backoff_s, between attempts; one warning line each): `post` returns a 200 answer's body, else raises
  RemoteRewardError naming `where`. `headers` ((name, value) pairs: an API key) are sent, never logged."""
  url: str
  timeout_s: float
  retries: int
  backoff_s: float
  max_backoff_s: float
  headers: tuple = dataclasses.field(default=(), repr=False)

  @classmethod
  def checked(cls, url: str, *, timeout_s, retries, backoff_s, max_backoff_s, headers=()) -> Retrying:
    """Each setting checked, in one line naming the server and the setting."""
    parsed = urllib.parse.urlparse(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
      raise UserError(f"reward server url={url!r} must be an http(s) URL like http://127.0.0.1:8000/score")
    for name, value, positive in (("timeout_s", timeout_s, True), ("backoff_s", backoff_s, False),
                                  ("max_backoff_s", max_backoff_s, False)):
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
          or value < 0 or (positive and value == 0):
        raise ValueError(f"reward server {url}: {name}={value!r} must be a finite number "
                         f"{'> 0' if positive else '>= 0'}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
      raise ValueError(f"reward server {url}: retries={retries!r} must be an integer >= 0")
    return cls(url, float(timeout_s), retries, float(backoff_s), float(max_backoff_s), tuple(headers))

  def post(self, body: bytes, where: str, timeout_s: float | None = None) -> bytes:
    last = ""
    for attempt in range(self.retries + 1):
      if attempt:
        wait = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        logging.warning("%s: attempt %d of %d failed (%s); retrying in %g s", where, attempt, self.retries + 1,
                        last, wait)
        time.sleep(wait)
      try:
        status, raw = self._post(body, timeout_s or self.timeout_s)
      except _Retryable as e:
        last = str(e)
        continue
      if status == 200:
        return raw
      message = _error_text(raw)
      if status in RETRY_STATUSES:
        last = f"HTTP {status}: {message}"
        continue
      raise RemoteRewardError(f"{where}: HTTP {status}: {message}")
    raise RemoteRewardError(f"{where}: failed after {self.retries + 1} attempt(s); last error: {last}")

  def _post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
    req = urllib.request.Request(self.url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json", **dict(self.headers)})
    try:
      with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.status, resp.read()
    except urllib.error.HTTPError as e:
      try:
        return e.code, e.read()
      except (OSError, http.client.HTTPException):
        return e.code, b""
      finally:
        e.close()
    except (socket.timeout, TimeoutError) as e:
      raise _Retryable(f"timed out after {timeout_s:g} s ({e})") from e
    except urllib.error.URLError as e:
      if isinstance(e.reason, (socket.timeout, TimeoutError)):
        raise _Retryable(f"timed out after {timeout_s:g} s ({e.reason})") from e
      raise _Retryable(f"connection failed: {e.reason}") from e
    except (ConnectionError, http.client.HTTPException, OSError) as e:
      raise _Retryable(f"connection failed: {type(e).__name__}: {e}") from e


@dataclasses.dataclass(frozen=True)
class _Chunk:
  start: int
  stop: int
  images: np.ndarray
  prompts: list[str]
  metadata: list[dict]


class RemoteRewardClient:
  """Sends batches to one reward server; `score` expects "scores", `texts` expects "texts"."""

  def __init__(self, url: str, *, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
               max_backoff_s: float = 8.0, chunk_size: int = 8, max_workers: int = 4,
               metadata_keys: Sequence[str] = ()):
    self.http = Retrying.checked(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                                 max_backoff_s=max_backoff_s)
    for name, value in (("chunk_size", chunk_size), ("max_workers", max_workers)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"reward server {url}: {name}={value!r} must be an integer >= 1")
    if isinstance(metadata_keys, str) or not all(isinstance(k, str) for k in metadata_keys):
      raise ValueError(f"reward server {url}: metadata_keys={metadata_keys!r} must be a list of strings")
    self.url = url
    self.timeout_s = self.http.timeout_s
    self.chunk_size, self.max_workers = chunk_size, max_workers
    self.metadata_keys = tuple(metadata_keys)

  def score(self, images, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None) -> np.ndarray:
    """float32 [B] scores from the server."""
    return np.asarray(self._request(images, prompts, metadata, "scores"), np.float32)

  def texts(self, images, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None) -> list[str]:
    """One text per image (an OCR server's reading)."""
    return self._request(images, prompts, metadata, "texts")

  def detections(self, images, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None) -> list[list]:
    """Per image, an object detector's detections ({"class", "score", "box"[, "color"]}, validated)."""
    return self._request(images, prompts, metadata, "detections")

  def _request(self, images, prompts, metadata, key: str) -> list:
    images = np.asarray(images)
    check_images(images, f"remote {self.url}")
    batch = images.shape[0]
    if isinstance(prompts, str) or prompts is None or len(prompts) != batch \
        or not all(isinstance(p, str) for p in prompts):
      raise ValueError(f"reward server {self.url}: prompts must be a list of {batch} strings, got {prompts!r:.200}")
    rows = metadata_rows(metadata, self.metadata_keys, batch)
    if not batch:
      return []
    first = first_row()  # errors name the batch's rows, also for a part of it
    chunks = [_Chunk(first + s, first + min(s + self.chunk_size, batch), images[s:s + self.chunk_size],
                     list(prompts[s:s + self.chunk_size]), rows[s:s + self.chunk_size])
              for s in range(0, batch, self.chunk_size)]
    if len(chunks) == 1:
      return self._send(chunks[0], key)
    pool = concurrent.futures.ThreadPoolExecutor(min(self.max_workers, len(chunks)),
                                                 thread_name_prefix="remote-reward")
    try:
      futures = [pool.submit(self._send, c, key) for c in chunks]
      out = []
      for f in futures:
        out.extend(f.result())
      return out
    finally:
      # On a failure, queued chunks are dropped rather than sent.
      pool.shutdown(wait=True, cancel_futures=True)

  def _send(self, chunk: _Chunk, key: str, timeout_s: float | None = None, what: str | None = None) -> list:
    where = f"reward server {self.url} ({what or f'images {chunk.start}..{chunk.stop - 1}'})"
    body = json.dumps({"images": [encode_png(im) for im in chunk.images], "prompts": chunk.prompts,
                       "metadata": chunk.metadata}).encode("utf-8")
    return self._parse(self.http.post(body, where, timeout_s), key, chunk.stop - chunk.start, where)

  def probe(self, key: str) -> None:
    """One real request before any model is built: a tiny gray image (with the configured metadata keys, null),
    sent with at most `PROBE_TIMEOUT_S` per attempt, its answer parsed as training parses one (`key`: "scores",
    "texts" or "detections"). Each failed attempt is one warning line; RemoteRewardError naming the server and what it
    answered when none succeeds."""
    chunk = _Chunk(0, 1, np.full((1, 32, 32, 3), 128, np.uint8), ["glmrl start-up check"],
                   [{k: None for k in self.metadata_keys}])
    try:
      self._send(chunk, key, timeout_s=min(self.timeout_s, PROBE_TIMEOUT_S), what="start-up check")
    except RemoteRewardError as e:
      hint = ("start the server (python -m glmrl.rewards.server ...) or fix the url" if "connection failed" in str(e)
              else f"the server must answer the protocol of glmrl.rewards.remote with a {key!r} list")
      raise RemoteRewardError(f"{e}; {hint}") from None

  @staticmethod
  def _parse(raw: bytes, key: str, count: int, where: str) -> list:
    try:
      answer = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise RemoteRewardError(f"{where}: answer is not JSON ({e}): {raw[:_QUOTE_CHARS]!r}") from e
    if not isinstance(answer, dict) or key not in answer:
      got = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
      raise RemoteRewardError(f"{where}: answer has no {key!r} list (got {got})")
    values = answer[key]
    if not isinstance(values, list) or len(values) != count:
      n = len(values) if isinstance(values, list) else type(values).__name__
      raise RemoteRewardError(f"{where}: {key!r} must be a list of {count} values, got {n}")
    for i, v in enumerate(values):
      if key == "texts" and not isinstance(v, str):
        raise RemoteRewardError(f"{where}: texts[{i}] = {v!r} is not a string")
      if key == "scores" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
        raise RemoteRewardError(f"{where}: scores[{i}] = {v!r} is not a finite number")
      if key == "detections":
        if not isinstance(v, list):
          raise RemoteRewardError(f"{where}: detections[{i}] = {v!r:.200} is not a list")
        try:
          values[i] = [check_detection(d, f"detections[{i}][{j}]") for j, d in enumerate(v)]
        except ValueError as e:
          raise RemoteRewardError(f"{where}: {e}") from None
    return values


def _error_text(raw: bytes) -> str:
  try:
    answer = json.loads(raw)
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
      return answer["error"][:_QUOTE_CHARS]
  except (UnicodeDecodeError, json.JSONDecodeError):
    pass
  return repr(raw[:_QUOTE_CHARS])


def remote_reward_factory(url: str, *, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
                          max_backoff_s: float = 8.0, chunk_size: int = 8, max_workers: int = 4,
                          metadata_keys: Sequence[str] = ()):
  """A host-side reward fn(images, prompts, metadata) -> the server's scores [B]."""
  client = RemoteRewardClient(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                              max_backoff_s=max_backoff_s, chunk_size=chunk_size, max_workers=max_workers,
                              metadata_keys=tuple(metadata_keys))
  client.probe("scores")

  def remote(images, prompts, metadata):
    return client.score(images, prompts, metadata)

  return remote


register_factory("remote", remote_reward_factory, pure_jax=False)
