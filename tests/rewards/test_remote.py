"""Remote reward client and reference server together on loopback (servers in threads, one CLI run).

Scores must round-trip exactly enough to match the in-process reward (1e-6); failures must raise
`RemoteRewardError` naming the server, after the configured number of attempts.
"""

import glmrl  # noqa: F401

import base64
import contextlib
import http.client
import http.server
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from PIL import Image

from glmrl import rewards
from glmrl.rewards import server as server_lib
from glmrl.errors import UserError
from glmrl.rewards.remote import RemoteRewardClient, RemoteRewardError, encode_png

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = dict(backoff_s=0.0, max_backoff_s=0.0)


@contextlib.contextmanager
def serving(scorer, **kwargs):
  server = server_lib.RewardServer(scorer, port=0, **kwargs)
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
  thread.start()
  try:
    yield server
  finally:
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def raw_server(answers):
  """Answers the i-th POST with answers[min(i, last)] = (status, body bytes); records the count."""
  calls = []

  class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
      pass

    def do_POST(self):
      self.rfile.read(int(self.headers["Content-Length"]))
      status, body = answers[min(len(calls), len(answers) - 1)]
      calls.append(status)
      self.send_response(status)
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  server.daemon_threads = True
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}/score", calls
  finally:
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def images():
  return np.random.default_rng(0).integers(0, 256, (5, 24, 20, 3), dtype=np.uint8)


def test_scores_round_trip_in_parallel_chunks(images):
  live, peak, lock = [0], [0], threading.Lock()

  def slow_brightness(imgs, prompts, metadata):
    with lock:
      live[0] += 1
      peak[0] = max(peak[0], live[0])
    time.sleep(0.2)
    with lock:
      live[0] -= 1
    assert [m["idx"] for m in metadata] == [int(p[1:]) for p in prompts]
    return server_lib.brightness(imgs, prompts, metadata)

  prompts = [f"p{i}" for i in range(5)]
  with serving(slow_brightness, workers=3) as server:
    client = RemoteRewardClient(server.url, chunk_size=2, max_workers=3, metadata_keys=["idx"], **FAST)
    got = client.score(images, prompts, {"idx": np.arange(5)})
  want = rewards.get("brightness")(images, None, None)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
  assert got.dtype == np.float32 and peak[0] >= 2  # the 3 chunks overlapped


def test_composer_entry_and_health(images):
  with serving(server_lib.brightness) as server:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    conn.request("GET", "/health")
    assert json.loads(conn.getresponse().read())["status"] == "ok"
    composer = rewards.RewardComposer([
        {"name": "remote", "weight": 2.0, "kwargs": {"url": server.url, "chunk_size": 3}},
        {"name": "brightness", "weight": 1.0}])
    total, parts = composer(images, ["a"] * 5)
  np.testing.assert_allclose(parts["remote"], parts["brightness"], rtol=0, atol=1e-6)
  np.testing.assert_allclose(total, 3 * parts["brightness"], rtol=0, atol=1e-5)


def test_server_error_fails_loudly_after_retries(images):
  calls = []

  def broken(imgs, prompts, metadata):
    calls.append(len(imgs))
    raise RuntimeError("model exploded")

  with serving(broken) as server:
    client = RemoteRewardClient(server.url, retries=2, **FAST)
    with pytest.raises(RemoteRewardError, match=r"reward server http://127\.0\.0\.1:\d+/score \(images 0\.\.4\): "
                       r"failed after 3 attempt\(s\); last error: HTTP 500: .*RuntimeError: model exploded"):
      client.score(images, ["a"] * 5)
  assert calls == [5, 5, 5]


def test_retry_succeeds_with_backoff(images):
  calls = []

  def flaky(imgs, prompts, metadata):
    calls.append(time.monotonic())
    if len(calls) <= 2:
      raise RuntimeError("warming up")
    return [0.5] * len(imgs)

  with serving(flaky) as server:
    client = RemoteRewardClient(server.url, retries=2, backoff_s=0.05, max_backoff_s=1.0)
    np.testing.assert_array_equal(client.score(images, ["a"] * 5), 0.5)
  assert len(calls) == 3
  assert calls[1] - calls[0] >= 0.05 and calls[2] - calls[1] >= 0.1  # 0.05 * 2**attempt


def test_timeout(images):
  def slow(imgs, prompts, metadata):
    time.sleep(1.0)
    return [1.0] * len(imgs)

  with serving(slow, workers=2) as server:
    client = RemoteRewardClient(server.url, timeout_s=0.2, retries=1, **FAST)
    t = time.monotonic()
    with pytest.raises(RemoteRewardError, match=r"failed after 2 attempt\(s\); last error: timed out after 0.2 s"):
      client.score(images[:2], ["a", "b"])
    assert time.monotonic() - t < 0.9


@pytest.mark.parametrize("body, message", [
    (b"<html>oops</html>", "answer is not JSON"),
    (b'{"scores": [1.0]}', r"'scores' must be a list of 2 values, got 1"),
    (b'{"scores": [1.0, NaN]}', r"scores\[1\] = nan is not a finite number"),
    (b'{"score": [1.0, 2.0]}', r"answer has no 'scores' list \(got \['score'\]\)"),
    (b'{"texts": ["a", 3]}', None),
])
def test_malformed_answer_is_not_retried(images, body, message):
  with raw_server([(200, body)]) as (url, calls):
    client = RemoteRewardClient(url, retries=3, **FAST)
    if message is None:
      with pytest.raises(RemoteRewardError, match=r"texts\[1\] = 3 is not a string"):
        client.texts(images[:2], ["a", "b"])
    else:
      with pytest.raises(RemoteRewardError, match=message):
        client.score(images[:2], ["a", "b"])
  assert calls == [200]


def test_status_handling(images):
  with raw_server([(400, b'{"error": "bad prompt"}')]) as (url, calls):
    with pytest.raises(RemoteRewardError, match=r"\(images 0\.\.1\): HTTP 400: bad prompt"):
      RemoteRewardClient(url, retries=3, **FAST).score(images[:2], ["a", "b"])
  assert calls == [400]  # a client error is not retried
  with raw_server([(503, b"busy"), (429, b""), (200, b'{"scores": [1, 2]}')]) as (url, calls):
    np.testing.assert_array_equal(RemoteRewardClient(url, retries=2, **FAST).score(images[:2], ["a", "b"]), [1, 2])
  assert calls == [503, 429, 200]


def test_oversized_request_gets_413(images):
  body = len(json.dumps({"images": [encode_png(im) for im in images[:2]], "prompts": ["a", "b"],
                         "metadata": [{}, {}]}))
  with serving(server_lib.brightness, limits=server_lib.Limits(max_request_bytes=body - 10)) as server:
    with pytest.raises(RemoteRewardError, match=rf"HTTP 413: request of {body} bytes is larger than "
                       rf"max_request_bytes={body - 10}; send fewer images"):
      RemoteRewardClient(server.url, retries=2, **FAST).score(images[:2], ["a", "b"])
    np.testing.assert_allclose(RemoteRewardClient(server.url, chunk_size=1, **FAST).score(images[:2], ["a", "b"]),
                               server_lib.brightness(images[:2], None, None), rtol=0, atol=1e-6)


def test_connection_refused(images):
  with serving(server_lib.brightness) as server:
    url = server.url
  with pytest.raises(RemoteRewardError, match=r"failed after 2 attempt\(s\); last error: connection failed"):
    RemoteRewardClient(url, retries=1, **FAST).score(images[:1], ["a"])


def test_client_input_errors(images):
  with pytest.raises(ValueError, match="must be an http"):
    RemoteRewardClient("ftp://x/score")
  with pytest.raises(ValueError, match=r"retries=-1 must be an integer >= 0"):
    RemoteRewardClient("http://127.0.0.1:1/score", retries=-1)
  with pytest.raises(ValueError, match=r"timeout_s=0 must be a finite number > 0"):
    RemoteRewardClient("http://127.0.0.1:1/score", timeout_s=0)
  client = RemoteRewardClient("http://127.0.0.1:1/score", metadata_keys=["seed"])
  with pytest.raises(ValueError, match=r"sends metadata\['seed'\], which is missing"):
    client.score(images, ["a"] * 5, {})
  with pytest.raises(ValueError, match=r"metadata\['seed'\] must hold one value per image \(5\)"):
    client.score(images, ["a"] * 5, {"seed": [1, 2]})
  with pytest.raises(ValueError, match=r"metadata\['seed'\]\[0\] is not JSON-serialisable"):
    client.score(images, ["a"] * 5, {"seed": [object()] * 5})
  with pytest.raises(ValueError, match="prompts must be a list of 5 strings"):
    client.score(images, ["a"] * 4, {"seed": list(range(5))})
  with pytest.raises(ValueError, match="must be uint8"):
    client.score(images.astype(np.float32), ["a"] * 5, {"seed": list(range(5))})
  with pytest.raises(ValueError, match="reward 'remote' takes no argument 'timeout'; it takes \\['url', 'timeout_s'"):
    rewards.RewardComposer([{"name": "remote", "weight": 1.0, "kwargs": {"url": "http://h/s", "timeout": 1}}])


def _post(port, body, content_type="application/json", headers=None):
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
  conn.putrequest("POST", "/score")
  conn.putheader("Content-Type", content_type)
  for k, v in (headers or {"Content-Length": str(len(body))}).items():
    conn.putheader(k, v)
  conn.endheaders()
  if body:
    conn.send(body)
  resp = conn.getresponse()
  return resp.status, json.loads(resp.read())["error"] if resp.status != 200 else json.loads(resp.read())


def _png(array, mode=None):
  buf = io.BytesIO()
  Image.fromarray(array, mode=mode).save(buf, format="PNG")
  return base64.b64encode(buf.getvalue()).decode()


def test_server_validates_input(images):
  limits = server_lib.Limits(max_request_bytes=20_000, max_images=3, max_side=32, max_total_pixels=2000)
  ok = encode_png(images[0])
  jpeg = io.BytesIO()
  Image.fromarray(images[0]).save(jpeg, format="JPEG")
  cases = [
      (json.dumps({"images": [ok], "prompts": ["a"]}).encode(), "application/octet-stream", 415, "Content-Type"),
      (b"\x80\x04K\x01.", "application/json", 400, "not valid JSON"),  # a pickle
      (b'{"images": [], "prompts": []}', "application/json", 400, "non-empty list"),
      (json.dumps({"images": [ok], "prompts": ["a"], "x": 1}).encode(), "application/json", 400, "unknown field"),
      (json.dumps({"images": [ok], "prompts": ["a", "b"]}).encode(), "application/json", 400, "prompts must be"),
      (json.dumps({"images": [ok] * 4, "prompts": ["a"] * 4}).encode(), "application/json", 400, "max_images=3"),
      (json.dumps({"images": [ok], "prompts": ["a"], "metadata": [1]}).encode(), "application/json", 400,
       "metadata must be"),
      (json.dumps({"images": ["@@@@"], "prompts": ["a"]}).encode(), "application/json", 400, "not valid base64"),
      (json.dumps({"images": [base64.b64encode(jpeg.getvalue()).decode()], "prompts": ["a"]}).encode(),
       "application/json", 400, "is not a PNG"),
      (json.dumps({"images": [_png(np.zeros((40, 8, 3), np.uint8))], "prompts": ["a"]}).encode(),
       "application/json", 400, "larger than max_side=32"),
      (json.dumps({"images": [_png(np.zeros((30, 30, 3), np.uint8))] * 3, "prompts": ["a"] * 3}).encode(),
       "application/json", 400, "max_total_pixels=2000"),
      (json.dumps({"images": [_png(np.zeros((8, 8, 4), np.uint8))], "prompts": ["a"]}).encode(),
       "application/json", 400, "mode 'RGBA'"),
      (b'{"images": [NaN], "prompts": ["a"]}', "application/json", 400, "NaN is not valid JSON"),
      # A PNG cut after its signature: the answer says so, without the decoder's in-memory file object.
      (json.dumps({"images": [base64.b64encode(base64.b64decode(ok)[:30]).decode()], "prompts": ["a"]}).encode(),
       "application/json", 400, "images[0] could not be decoded (not a readable PNG: truncated or corrupt)"),
  ]
  with serving(server_lib.brightness, limits=limits) as server:
    port = server.server_address[1]
    for body, ctype, status, message in cases:
      got_status, error = _post(port, body, ctype)
      assert (got_status, message in error) == (status, True), (message, got_status, error)
    status, error = _post(port, b"", headers={"Content-Length": str(10**9)})  # refused before reading
    assert status == 413 and "max_request_bytes=20000" in error
    # A client sending a body many times the limit (5 MB here) reads the 413, not a reset connection.
    status, error = _post(port, b"x" * 5_000_000)
    assert status == 413 and "request of 5000000 bytes is larger than max_request_bytes=20000" in error
    status, answer = _post(port, json.dumps({"images": [ok], "prompts": ["a"]}).encode())
    assert status == 200 and len(answer["scores"]) == 1


def test_no_error_answer_quotes_a_python_objects_repr(images):
  def scorer(imgs, prompts, metadata):
    raise RuntimeError(f"cannot score {object()!r}")

  with serving(scorer) as server:
    with pytest.raises(RemoteRewardError) as e:
      RemoteRewardClient(server.url, retries=0).score(images[:1], ["a"])
  assert "RuntimeError: cannot score an object" in str(e.value) and " at 0x" not in str(e.value)


def test_scorer_output_checked():
  for out, message in (([1.0], "must return 2 values"), ([1.0, float("nan")], "output[1] = nan"),
                       ([1.0, "x"], "output[1] = 'x'")):
    with serving(lambda imgs, p, m, out=out: out) as server:
      with pytest.raises(RemoteRewardError, match=re.escape(message)):
        RemoteRewardClient(server.url, retries=0).score(np.zeros((2, 8, 8, 3), np.uint8), ["a", "b"])


def test_load_scorer_and_cli_errors(capsys):
  assert server_lib.load_scorer("glmrl.rewards.server:brightness") is server_lib.brightness
  assert server_lib.main(["--scorer=glmrl.rewards.server"]) == 2
  assert "must be module:function" in capsys.readouterr().err
  assert server_lib.main(["--scorer=glmrl.rewards.nope:f"]) == 2
  assert "cannot import 'glmrl.rewards.nope'" in capsys.readouterr().err
  assert server_lib.main(["--scorer=glmrl.rewards.server:missing"]) == 2
  assert "no callable 'missing'" in capsys.readouterr().err
  for flag, value, why in (("--max_request_mb", "inf", "is not a finite number of MiB > 0 (e.g. 64)"),
                           ("--max_request_mb", "nan", "is not a finite number of MiB > 0 (e.g. 64)"),
                           ("--max_request_mb", "0", "is not a finite number of MiB > 0 (e.g. 64)"),
                           ("--max_images", "0", "is not a whole number >= 1"),
                           ("--workers", "-2", "is not a whole number >= 1"),
                           ("--max_side", "1.5", "is not a whole number >= 1")):
    with pytest.raises(SystemExit) as e:
      server_lib.main(["--scorer=glmrl.rewards.server:brightness", f"{flag}={value}"])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"error: argument {flag}: '{value}' {why} (python -m glmrl.rewards.server --help)\n"
  for port in ("99999", "-1", "http"):
    with pytest.raises(SystemExit) as e:
      server_lib.main(["--scorer=glmrl.rewards.server:brightness", f"--port={port}"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"error: argument --port: '{port}' is not a port: a number in 0..65535 (0: any "
                                       "free port) (python -m glmrl.rewards.server --help)\n")
  with socket.create_server(("127.0.0.1", 0)) as busy:
    port = busy.getsockname()[1]
    # The port is checked before the scorer is imported (this one does not exist).
    assert server_lib.main(["--scorer=glmrl.rewards.nope:f", f"--port={port}"]) == 2
    assert capsys.readouterr().err == (f"error: --port={port}: in use on 127.0.0.1 (another server?): pick another "
                                       "port, or --port=0 for any free one\n")


def test_cli_serves_example_scorer(images):
  proc = subprocess.Popen(
      [sys.executable, "-m", "glmrl.rewards.server", "--scorer=glmrl.rewards.server:brightness", "--port=0"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  try:
    line = proc.stdout.readline()
    assert line.startswith("serving glmrl.rewards.server:brightness on http://127.0.0.1:"), (line, proc.stderr)
    url = line.split()[-1]
    got = RemoteRewardClient(url, **FAST).score(images, ["a"] * 5)
    np.testing.assert_allclose(got, rewards.get("brightness")(images, None, None), rtol=0, atol=1e-6)
  finally:
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.parametrize("factory,kwargs,key", [
    ("remote", {}, "scores"), ("text_accuracy", {}, "texts"), ("ocr_word_accuracy", {}, "texts"),
    ("geneval", {}, "detections")])
def test_every_server_backed_reward_checks_its_server_with_a_real_request_when_built(factory, kwargs, key):
  """Before any model: a server answering 200 with garbage (its /health fine) is refused in one request (a parse
  error is not retried), naming the server, the check and the answer; a correct answer builds the reward."""
  with raw_server([(200, b"<html>hello</html>")]) as (url, calls):
    with pytest.raises(UserError, match=rf"reward server {url} \(start-up check\): answer is not JSON .*hello.*; "
                       rf"the server must answer the protocol of glmrl.rewards.remote with a '{key}' list"):
      rewards.get(factory).build(url=url, retries=3, **FAST, **kwargs)
  assert calls == [200]
  good = {"scores": b'{"scores": [0.5]}', "texts": b'{"texts": ["hi"]}', "detections": b'{"detections": [[]]}'}
  with raw_server([(200, good[key])]) as (url, calls):
    rewards.get(factory).build(url=url, **FAST, **kwargs)
  assert calls == [200]


def test_the_start_up_check_sends_the_metadata_keys_and_says_each_retry_on_one_line(caplog):
  seen = []

  def scorer(imgs, prompts, metadata):
    seen.append((len(imgs), imgs[0].shape, metadata))
    return [0.0] * len(imgs)

  with serving(scorer) as server:
    RemoteRewardClient(server.url, metadata_keys=["tag"], **FAST).probe("scores")
  assert seen == [(1, (32, 32, 3), [{"tag": None}])]
  with raw_server([(503, b"busy"), (503, b"busy"), (200, b'{"scores": [1]}')]) as (url, calls):
    with caplog.at_level("WARNING"):
      RemoteRewardClient(url, retries=2, **FAST).probe("scores")
  retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
  assert retries == [f"reward server {url} (start-up check): attempt {i} of 3 failed (HTTP 503: b'busy'); "
                     "retrying in 0 s" for i in (1, 2)], retries
  assert calls == [503, 503, 200]


def test_the_start_up_check_waits_less_than_a_training_request():
  """A server that accepts the connection and never answers: each attempt of the check ends at PROBE_TIMEOUT_S
  (shortened here), not at the client's timeout_s."""
  import socket
  from glmrl.rewards import remote

  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)  # accepted by the kernel, never read or answered
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/score"
    old, remote.PROBE_TIMEOUT_S = remote.PROBE_TIMEOUT_S, 0.3
    try:
      start = time.monotonic()
      with pytest.raises(UserError, match=r"failed after 2 attempt\(s\); last error: timed out after 0.3 s"):
        RemoteRewardClient(url, timeout_s=60.0, retries=1, **FAST).probe("scores")
      assert time.monotonic() - start < 5
    finally:
      remote.PROBE_TIMEOUT_S = old
