"""The processes of a run meeting before jax.distributed (glmrl/runtime/rendezvous.py): each launch mistake is one
line in the processes it concerns, within the deadline, and a good launch passes.

The processes here are threads of the test's process calling `meet` as main.py's processes call it (the protocol
is plain sockets); tests/test_main.py launches main.py itself as two processes that disagree."""

import socket
import threading

import pytest

from glmrl.runtime import rendezvous
from glmrl.errors import UserError
from tests.train.processes import free_port

FACTS = {"mode": "train", "workdir": "/w", "code": "c0de", "versions": {"jax": "0.10.2"}, "use_ema": False,
         "config": {"train.num_steps": "3", "seed": "0"}}


def _meet_all(launches: list[dict], timeout_s: float = 20.0) -> list[str | None]:
  """Runs `meet` for each launch ({process_id, num_processes, facts}; process 0 first) at once on one free port;
  returns each one's error message (None where it went on)."""
  address = f"localhost:{free_port()}"
  results: list[str | None] = [None] * len(launches)

  def one(i, launch):
    try:
      rendezvous.meet(address, launch["num_processes"], launch["process_id"], launch.get("timeout_s", timeout_s),
                      launch.get("facts", FACTS))
    except UserError as e:
      results[i] = str(e)

  threads = [threading.Thread(target=one, args=(i, launch)) for i, launch in enumerate(launches)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=timeout_s + 90)  # a hang detector
    assert not t.is_alive(), "meet did not return"
  return results


def test_processes_that_agree_go_on_and_free_the_port():
  launches = [{"process_id": i, "num_processes": 3} for i in range(3)]
  assert _meet_all(launches) == [None, None, None]
  # The coordinator then binds the same port (process 0 closed it; nothing of it lingers).
  address = f"localhost:{free_port()}"
  port = int(address.split(":")[1])
  threads = [threading.Thread(target=rendezvous.meet, args=(address, 2, i, 20, FACTS)) for i in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  with socket.create_server(("", port)):
    pass


def test_a_process_that_never_starts_is_named_by_process_0_at_the_deadline():
  """Process 2 arrives (its own deadline long: on a loaded machine its thread may start late), process 1 never."""
  got = _meet_all([{"process_id": 0, "num_processes": 3, "timeout_s": 4},
                   {"process_id": 2, "num_processes": 3, "timeout_s": 60}])
  want = "process 0 waited 4 s (--distributed_timeout) for process(es) 1 of 3"
  assert got[0].startswith(want) and got[1] == f"process 0 refused this run: {got[0]}"


def test_process_0_that_never_starts_is_one_line_in_the_others():
  (got,) = _meet_all([{"process_id": 1, "num_processes": 2, "timeout_s": 1.0}])
  assert got.startswith("process 1: nothing answered at --coordinator_address=localhost:") and "for 1 s" in got


@pytest.mark.parametrize("peer,message", [
    ({"num_processes": 3}, "process 1 was started with --num_processes=3 and process 0 with --num_processes=2"),
    ({"facts": {**FACTS, "mode": "eval"}}, "process 1 was started with --mode=eval and process 0 with --mode=train"),
    ({"facts": {**FACTS, "workdir": "/v"}}, "process 1 was started with --workdir=/v and process 0 with --workdir=/w"),
    ({"facts": {**FACTS, "config": {"train.num_steps": "4", "seed": "0"}}},
     "process 1 has config.train.num_steps=4 and process 0 config.train.num_steps=3: start every process with the "
     "same --config and flags"),
    ({"facts": {**FACTS, "code": "beef"}}, "process 1 runs other glmrl code than process 0 (source digest of main.py, "
                                           "glmrl/ and configs/ beef vs c0de)"),
    ({"facts": {**FACTS, "versions": {"jax": "0.10.1"}}}, "process 1 has jax==0.10.1 and process 0 jax==0.10.2: "
                                                          "install the same versions on every host"),
    ({"facts": {**FACTS, "use_ema": True}}, "process 1 was started with --use_ema=True and process 0 with "
                                            "--use_ema=False"),
], ids=["num_processes", "mode", "workdir", "config", "code", "versions", "use_ema"])
def test_a_process_that_disagrees_is_refused_in_every_process(peer, message):
  got = _meet_all([{"process_id": 0, "num_processes": 2}, {"process_id": 1, "num_processes": 2, **peer}])
  assert got[0].startswith(message), got
  assert got[1] == f"process 0 refused this run: {got[0]}"


def test_an_id_beyond_process_0s_count_is_refused():
  got = _meet_all([{"process_id": 0, "num_processes": 2}, {"process_id": 2, "num_processes": 3}])
  assert got[0] == "a process was started with --process_id=2 and --num_processes=3, process 0 with --num_processes=2"


def test_two_processes_with_one_id_are_refused():
  got = _meet_all([{"process_id": 0, "num_processes": 3}, {"process_id": 1, "num_processes": 3},
                   {"process_id": 1, "num_processes": 3}])
  assert got[0] == "two processes were started with --process_id=1: give each process its own id in 0..2"
  assert got[1:] == [f"process 0 refused this run: {got[0]}"] * 2


def test_a_second_process_0_finds_the_port_taken():
  port = free_port()
  with socket.create_server(("", port)):
    with pytest.raises(UserError, match=f"port {port} is in use on this host .* a second process given "
                                        "--process_id=0"):
      rendezvous.meet(f"localhost:{port}", 2, 0, 5, FACTS)


def test_a_port_held_by_another_program_is_not_taken_for_process_0():
  """What answers is no rendezvous (a program that reads and closes, as jax's coordinator does a stray process)."""
  port = free_port()
  server = socket.create_server(("", port))

  def answer_garbage():
    conn, _ = server.accept()
    conn.recv(1000)
    conn.sendall(b"\x00\x00\x12\x04")
    conn.close()

  t = threading.Thread(target=answer_garbage)
  t.start()
  try:
    with pytest.raises(UserError, match=r"is not process 0 waiting for its processes: .* \(is this --process_id "
                                        r"given twice\?\)"):
      rendezvous.meet(f"localhost:{port}", 2, 1, 5, FACTS)
  finally:
    t.join(30)
    server.close()


@pytest.mark.parametrize("address,message", [
    ("http://10.0.0.1:1234", "--coordinator_address=http://10.0.0.1:1234: HOST:PORT without a scheme, e.g. "
                             "10.0.0.1:1234"),
    ("10.0.0.1", "--coordinator_address=10.0.0.1: expected HOST:PORT"),
    ("10.0.0.1:99999", "--coordinator_address=10.0.0.1:99999: the port must be a number in 1..65535, got '99999'"),
    ("host:port", "--coordinator_address=host:port: the port must be a number in 1..65535, got 'port'"),
    (":1234", "--coordinator_address=:1234: expected HOST:PORT"),
])
def test_an_address_that_is_not_host_and_port_is_one_line(address, message):
  with pytest.raises(UserError) as e:
    rendezvous.parse_address(address)
  assert str(e.value).startswith(message)


def test_addresses_of_every_form_parse():
  assert rendezvous.parse_address("localhost:1234") == ("localhost", 1234)
  assert rendezvous.parse_address("[::1]:8476") == ("::1", 8476)
  assert rendezvous.parse_address("10.0.0.1:1") == ("10.0.0.1", 1)


def test_the_code_digest_follows_the_sources(tmp_path):
  (tmp_path / "glmrl" / "policy").mkdir(parents=True)
  (tmp_path / "configs").mkdir()
  (tmp_path / "glmrl" / "policy" / "ar.py").write_text("x = 1\n")
  (tmp_path / "configs" / "demo.py").write_text("y = 1\n")
  first = rendezvous.code_digest(str(tmp_path))
  assert rendezvous.code_digest(str(tmp_path)) == first and len(first) == 16
  (tmp_path / "glmrl" / "policy" / "notes.txt").write_text("not code")
  assert rendezvous.code_digest(str(tmp_path)) == first
  (tmp_path / "main.py").write_text("z = 1\n")
  assert rendezvous.code_digest(str(tmp_path)) != first
  first = rendezvous.code_digest(str(tmp_path))
  for path in (tmp_path / "glmrl" / "policy" / "ar.py", tmp_path / "configs" / "demo.py", tmp_path / "main.py"):
    path.write_text("x = 2\n")
    assert rendezvous.code_digest(str(tmp_path)) != first
    first = rendezvous.code_digest(str(tmp_path))
  assert rendezvous.code_digest() != first  # this checkout's own sources
