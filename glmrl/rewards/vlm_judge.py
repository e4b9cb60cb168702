"""A VLM judge over the OpenAI chat-completions protocol (vLLM's, SGLang's or `transformers serve`'s
`/v1/chat/completions`): each image is asked the config's question and scored from the answer.

    {"name": "vlm_judge", "weight": 1.0, "kwargs": {
        "url": "http://127.0.0.1:8000/v1/chat/completions", "model": "Qwen/Qwen2.5-VL-7B-Instruct",
        "template": "Does this image show {prompt}? Answer Yes or No."}}

One request per image: the image as a base64 PNG data URL, then the template with `{prompt}` (and each of
`metadata_keys` by name) filled in, after an optional system message; temperature 0. Two scoring rules:
- `p_yes` (Flow-Factory's `vllm_evaluate`): one answer token (`max_completion_tokens=1`, `logprobs`, `top_logprobs`);
  the score is P(yes) / (P(yes) + P(no)), each the summed probability of the top tokens that equal `yes` (`no`) with
  case and surrounding spaces ignored. The server must return log-probabilities (vLLM and SGLang do; `transformers
  serve` refuses the fields).
- `parsed`: the answer's text (at most `max_tokens` tokens); `pattern`'s first group read as a number in
  [lo, hi] = `scale` and scaled to [0, 1].
An answer that lacks both tokens, does not match, or reads outside the scale, and a server that fails after the
retries (`glmrl.rewards.remote.Retrying`: timeouts, connection errors, 408/429/5xx) are `RemoteRewardError`s naming
the server and the image's row of the batch: never a score (Flow-Factory answers 0.0 where the judge failed).

At most `max_concurrency` requests are in flight. Scores are cached in memory, keyed by the image's PNG digest,
the filled-in question, the model and the rule (the last `cache_size`): an image asked the same question again is
not sent. The API key, if the server needs one, is read from the environment variable `api_key_env` names (never
from the config) and sent as a bearer token; it is never logged. The judge is checked at start-up with one request
(a tiny gray image), answered and parsed as in training.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import inspect
import json
import math
import os
import re
import string
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from glmrl.errors import UserError
from glmrl.rewards.registry import check_images, first_row, register_factory
from glmrl.rewards.remote import PROBE_TIMEOUT_S, RemoteRewardError, Retrying, encode_png, metadata_rows

RULES = ("p_yes", "parsed")
_QUOTE_CHARS = 200


def _template_fields(template: str) -> list[str]:
  return [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]


class VlmJudge:
  """Scores images by asking an OpenAI-compatible chat-completions server (see the module docstring)."""

  def __init__(self, url: str, model: str, template: str, *, rule: str = "p_yes", system: str = "",
               yes: str = "yes", no: str = "no", top_logprobs: int = 20, pattern: str = "", scale=(0.0, 10.0),
               max_tokens: int = 16, metadata_keys: Sequence[str] = (), api_key_env: str = "",
               max_concurrency: int = 8, cache_size: int = 10000, timeout_s: float = 60.0, retries: int = 3,
               backoff_s: float = 0.5, max_backoff_s: float = 8.0):
    where = f"VLM judge {url}"
    for name, value in (("model", model), ("template", template)):
      if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: {name}={value!r} must be a non-empty string")
    if isinstance(metadata_keys, str) or not all(isinstance(k, str) for k in metadata_keys):
      raise ValueError(f"{where}: metadata_keys={metadata_keys!r} must be a list of strings")
    try:
      fields = _template_fields(template)
    except ValueError as e:
      raise ValueError(f"{where}: template={template!r} is not a format string ({e})") from None
    unknown = [f for f in fields if f not in ("prompt", *metadata_keys)]
    if unknown:
      raise ValueError(f"{where}: template={template!r} names {unknown}: it may name {{prompt}} and the "
                       f"metadata_keys {list(metadata_keys)}")
    if rule not in RULES:
      raise ValueError(f"{where}: rule={rule!r} must be one of {list(RULES)}")
    if rule == "p_yes":
      for name, value in (("yes", yes), ("no", no)):
        if not isinstance(value, str) or not value.strip():
          raise ValueError(f"{where}: {name}={value!r} must be a non-empty string")
      if yes.strip().lower() == no.strip().lower():
        raise ValueError(f"{where}: yes={yes!r} and no={no!r} must differ")
    else:
      try:
        compiled = re.compile(pattern) if isinstance(pattern, str) and pattern else None
      except re.error as e:
        raise ValueError(f"{where}: pattern={pattern!r} is not a regular expression ({e})") from None
      if compiled is None or compiled.groups < 1:
        raise ValueError(f"{where}: rule='parsed' needs a pattern with a group around the number, e.g. "
                         "'([0-9]+(?:\\\\.[0-9]+)?)'")
      self.pattern = compiled
      if not (isinstance(scale, (tuple, list)) and len(scale) == 2
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scale)
              and scale[0] < scale[1]):
        raise ValueError(f"{where}: scale={scale!r} must be (lo, hi), two finite numbers with lo < hi")
    for name, value, lo in (("top_logprobs", top_logprobs, 1), ("max_tokens", max_tokens, 1),
                            ("max_concurrency", max_concurrency, 1), ("cache_size", cache_size, 0)):
      if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{where}: {name}={value!r} must be an integer >= {lo}")
    headers = ()
    if api_key_env:
      key = os.environ.get(api_key_env, "")
      if not key:
        raise UserError(f"{where}: api_key_env={api_key_env!r} names an environment variable that is not set")
      headers = (("Authorization", f"Bearer {key}"),)
    self.http = Retrying.checked(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                                 max_backoff_s=max_backoff_s, headers=headers)
    self.url, self.model, self.template, self.rule, self.system = url, model, template, rule, system
    self.yes, self.no, self.top_logprobs = yes.strip().lower(), no.strip().lower(), top_logprobs
    self.scale, self.max_tokens = tuple(float(v) for v in scale), max_tokens
    self.metadata_keys, self.max_concurrency = tuple(metadata_keys), max_concurrency
    self.cache_size = cache_size
    self._cache: collections.OrderedDict[str, float] = collections.OrderedDict()
    self._lock = threading.Lock()

  def question(self, prompt: str, row: Mapping[str, Any]) -> str:
    return self.template.format(prompt=prompt, **{k: row[k] for k in self.metadata_keys})

  def body(self, png: str, text: str) -> dict:
    """The chat-completions request for one image and its question."""
    messages = [{"role": "system", "content": self.system}] if self.system else []
    messages.append({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "text", "text": text}]})
    body = {"model": self.model, "messages": messages, "temperature": 0.0}
    if self.rule == "p_yes":
      body.update(max_completion_tokens=1, logprobs=True, top_logprobs=self.top_logprobs)
    else:
      body.update(max_completion_tokens=self.max_tokens)
    return body

  def score(self, images, prompts: Sequence[str], metadata: Mapping[str, Any] | None = None) -> np.ndarray:
    """float32 [B] scores in [0, 1]."""
    images = np.asarray(images)
    check_images(images, self.url)
    batch = images.shape[0]
    if isinstance(prompts, str) or len(prompts) != batch or not all(isinstance(p, str) for p in prompts):
      raise ValueError(f"VLM judge {self.url}: prompts must be a list of {batch} strings, got {prompts!r:.200}")
    rows = metadata_rows(metadata, self.metadata_keys, batch)
    first = first_row()
    if not batch:
      return np.zeros((0,), np.float32)
    if batch == 1:
      return np.asarray([self._one(images[0], prompts[0], rows[0], f"image {first}")], np.float32)
    pool = concurrent.futures.ThreadPoolExecutor(min(self.max_concurrency, batch), thread_name_prefix="vlm-judge")
    try:
      futures = [pool.submit(self._one, images[i], prompts[i], rows[i], f"image {first + i}") for i in range(batch)]
      return np.asarray([f.result() for f in futures], np.float32)
    finally:
      pool.shutdown(wait=True, cancel_futures=True)  # after a failure, queued images are not sent

  def _one(self, image, prompt: str, row: Mapping[str, Any], what: str, timeout_s: float | None = None,
           cached: bool = True) -> float:
    png, text = encode_png(image), self.question(prompt, row)
    key = hashlib.sha256("\0".join((png, text, self.model, self.rule, repr(self._rule_settings()))).encode())
    key = key.hexdigest()
    if cached and self.cache_size:
      with self._lock:
        if key in self._cache:
          self._cache.move_to_end(key)
          return self._cache[key]
    where = f"VLM judge {self.url} ({what})"
    raw = self.http.post(json.dumps(self.body(png, text)).encode("utf-8"), where, timeout_s)
    value = self._parse(raw, where)
    if cached and self.cache_size:
      with self._lock:
        self._cache[key] = value
        while len(self._cache) > self.cache_size:
          self._cache.popitem(last=False)
    return value

  def _rule_settings(self) -> tuple:
    if self.rule == "p_yes":
      return (self.yes, self.no, self.top_logprobs, self.system)
    return (self.pattern.pattern, self.scale, self.max_tokens, self.system)

  def _parse(self, raw: bytes, where: str) -> float:
    try:
      answer = json.loads(raw)
      choice = answer["choices"][0]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
      raise RemoteRewardError(f"{where}: not a chat completion ({type(e).__name__}: {e}): "
                              f"{raw[:_QUOTE_CHARS]!r}") from None
    if self.rule == "p_yes":
      return self._p_yes(choice, where)
    content = (choice.get("message") or {}).get("content") if isinstance(choice, dict) else None
    if not isinstance(content, str):
      raise RemoteRewardError(f"{where}: the answer has no message content: {json.dumps(choice)[:_QUOTE_CHARS]}")
    match = self.pattern.search(content)
    if match is None:
      raise RemoteRewardError(f"{where}: the answer {content[:_QUOTE_CHARS]!r} does not match "
                              f"pattern={self.pattern.pattern!r}")
    try:
      number = float(match.group(1))
    except (TypeError, ValueError):
      raise RemoteRewardError(f"{where}: the answer {content[:_QUOTE_CHARS]!r}: {match.group(1)!r} is not a "
                              "number") from None
    lo, hi = self.scale
    if not lo <= number <= hi:
      raise RemoteRewardError(f"{where}: the answer {content[:_QUOTE_CHARS]!r} reads {number:g}, outside "
                              f"scale=({lo:g}, {hi:g})")
    return (number - lo) / (hi - lo)

  def _p_yes(self, choice, where: str) -> float:
    try:
      top = choice["logprobs"]["content"][0]["top_logprobs"]
      pairs = [(str(t["token"]), float(t["logprob"])) for t in top]
    except (KeyError, IndexError, TypeError, ValueError):
      got = json.dumps(choice.get("logprobs") if isinstance(choice, dict) else choice)[:_QUOTE_CHARS]
      raise RemoteRewardError(f"{where}: the answer has no top_logprobs of its first token (got logprobs {got}): "
                              "the server must return log-probabilities for rule='p_yes'") from None
    p = {self.yes: 0.0, self.no: 0.0}
    for token, logprob in pairs:
      if token.strip().lower() in p and math.isfinite(logprob):
        p[token.strip().lower()] += math.exp(logprob)
    if p[self.yes] + p[self.no] <= 0:
      raise RemoteRewardError(f"{where}: the answer's top {len(pairs)} tokens hold neither {self.yes!r} nor "
                              f"{self.no!r}: {[t for t, _ in pairs][:20]}")
    return p[self.yes] / (p[self.yes] + p[self.no])

  def probe(self) -> None:
    """One request before any model is built: a tiny gray image, answered and parsed as in training."""
    row = {k: None for k in self.metadata_keys}
    try:
      self._one(np.full((32, 32, 3), 128, np.uint8), "glmrl start-up check", row, "start-up check",
                timeout_s=min(self.http.timeout_s, PROBE_TIMEOUT_S), cached=False)
    except RemoteRewardError as e:
      hint = ("start the judge's server or fix the url" if "connection failed" in str(e)
              else "the server must answer OpenAI chat completions as the rule needs")
      raise RemoteRewardError(f"{e}; {hint}") from None
    except (KeyError, IndexError, ValueError) as e:  # the template with null metadata
      raise ValueError(f"VLM judge {self.url}: the template cannot be filled in ({e})") from None


def vlm_judge_factory(url: str, model: str, template: str, **kwargs):
  """A host-side reward fn(images, prompts, metadata) -> the judge's scores [B] in [0, 1]."""
  judge = VlmJudge(url, model, template, **kwargs)
  judge.probe()

  def vlm_judge(images, prompts, metadata):
    return judge.score(images, prompts, metadata)

  return vlm_judge


# The config's kwargs are checked against the judge's own (`Reward.kwargs_problem` reads the factory's signature).
vlm_judge_factory.__signature__ = inspect.signature(VlmJudge)
register_factory("vlm_judge", vlm_judge_factory, pure_jax=False)
