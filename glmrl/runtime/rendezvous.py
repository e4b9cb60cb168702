"""The processes of one run meet before `jax.distributed` starts, so that a launch mistake is one line, not a hang.

`jax.distributed.initialize` waits for every process in C++ and, at its deadline, aborts the process with a stack
trace; two processes with one `--process_id` abort or wait for ever; processes started with different
`--num_processes`, configs or code run side by side until their collectives disagree. So, before it, process 0
listens on the coordinator's own port, every other process connects and says who it is (process id, process
count, mode, workdir, config, code), and process 0 answers once every process has arrived and agrees, or with the
first mismatch, or at the deadline with the processes still missing. Each process then raises one `UserError`
(main.py prints it, exit status 2) or goes on to `jax.distributed.initialize`, which then finds every process
present. Process 0 closes the port before the coordinator takes it.

Standard library only (no jax): the tests start bare processes on it.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import json
import os
import socket
import time

from glmrl.errors import UserError

# What every process of a run must hold equally, in the order a mismatch is reported.
FACTS = ("num_processes", "mode", "workdir", "code", "versions", "use_ema", "config")
# The packages whose versions every process must share (their programs, checkpoints and collectives meet).
PACKAGES = ("jax", "jaxlib", "flax", "orbax-checkpoint", "optax")
_TAG = "glmrl-rendezvous-1"
_HELLO_WAIT_S = 10.0  # a connection that says nothing for this long is not one of the run's processes


def parse_address(address: str) -> tuple[str, int]:
  """(host, port) of `--coordinator_address=HOST:PORT` ([v6 address]:PORT too); a UserError names what is wrong."""
  flag = f"--coordinator_address={address}"
  if "://" in address:
    raise UserError(f"{flag}: HOST:PORT without a scheme, e.g. {address.split('://', 1)[1].split('/')[0]}")
  host, sep, port = address.rpartition(":")
  if not sep or not host or "/" in address:
    raise UserError(f"{flag}: expected HOST:PORT (process 0's host name or address and a free port), "
                    "e.g. 10.0.0.1:1234")
  if not port.isdigit() or not 1 <= int(port) <= 65535:
    raise UserError(f"{flag}: the port must be a number in 1..65535, got {port!r}")
  return host.strip("[]"), int(port)


def launch_facts() -> dict:
  """The facts of this host's installation every process must share: its code and the packages' versions."""
  versions = {}
  for package in PACKAGES:
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      versions[package] = None
  return {"code": code_digest(), "versions": versions}


def code_digest(root: str | None = None) -> str:
  """A digest of main.py and the Python sources of glmrl and the shipped configs under `root` (default: this
  checkout): hosts that run other code are told apart before their programs disagree."""
  root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  main = os.path.join(root, "main.py")
  if os.path.isfile(main):
    with open(main, "rb") as f:
      digest.update(b"main.py" + f.read())
  for folder in ("glmrl", "configs"):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
      dirnames.sort()
      for name in sorted(f for f in filenames if f.endswith(".py")):
        path = os.path.join(dirpath, name)
        digest.update(os.path.relpath(path, root).encode())
        with open(path, "rb") as f:
          digest.update(f.read())
  return digest.hexdigest()[:16]


def meet(address: str, num_processes: int, process_id: int, timeout_s: float, facts: dict) -> None:
  """Returns once all `num_processes` processes have met at `address` and agree on `facts` (a JSON-able dict of
  FACTS' keys but num_processes; `config` a {key: value} mapping); else raises one UserError, in every process
  that can be told why. `timeout_s`: how long process 0 waits for the others, and they for it."""
  host, port = parse_address(address)
  mine = {"tag": _TAG, "process_id": process_id, "num_processes": num_processes, **facts}
  if process_id == 0:
    _serve(port, mine, timeout_s)
  else:
    _join(host, port, mine, timeout_s)


def _serve(port: int, mine: dict, timeout_s: float) -> None:
  n = mine["num_processes"]
  try:
    server = _listen(port)
  except OSError as e:
    if e.errno == errno.EADDRINUSE:
      raise UserError(f"--coordinator_address: port {port} is in use on this host (another run's coordinator, or a "
                      "second process given --process_id=0): pick a free port for every process") from None
    raise UserError(f"--coordinator_address: process 0 cannot listen on port {port} ({e.strerror or e})") from None
  ids, conns = set(), []
  deadline = time.monotonic() + timeout_s
  try:
    problem = None
    while len(ids) < n - 1 and problem is None:
      left = deadline - time.monotonic()
      if left <= 0:
        missing = [i for i in range(1, n) if i not in ids]
        problem = (f"process 0 waited {timeout_s:g} s (--distributed_timeout) for process(es) "
                   f"{', '.join(map(str, missing))} of {n}: start each with the same --coordinator_address, "
                   f"--num_processes={n} and its own --process_id")
        break
      server.settimeout(left)
      try:
        conn, _ = server.accept()
      except socket.timeout:
        continue
      hello = _read_line(conn, _HELLO_WAIT_S)
      if not isinstance(hello, dict) or hello.get("tag") != _TAG:
        conn.close()  # not one of this run's processes (a port scan, another program)
        continue
      conns.append(conn)
      peer_id = hello.get("process_id")
      if peer_id in ids:
        problem = (f"two processes were started with --process_id={peer_id}: give each process its own id in "
                   f"0..{n - 1}")
      else:
        problem = mismatch(hello, mine)
        ids.add(peer_id)
    answer = {"tag": _TAG, "problem": problem}
    for conn in conns:
      _send(conn, answer)
    for conn in conns:  # the peers close first: no connection of this port lingers on process 0's side
      _read_line(conn, 5.0)
      conn.close()
  finally:
    server.close()
  if problem:
    raise UserError(problem)


def _join(host: str, port: int, mine: dict, timeout_s: float) -> None:
  where = f"--coordinator_address={host}:{port}"
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      conn = socket.create_connection((host, port), timeout=max(1.0, min(5.0, deadline - time.monotonic())))
      break
    except socket.gaierror as e:
      raise UserError(f"{where}: cannot resolve host {host!r} ({e.strerror or e})") from None
    except OSError:
      if time.monotonic() >= deadline:
        raise UserError(f"process {mine['process_id']}: nothing answered at {where} for {timeout_s:g} s "
                        "(--distributed_timeout): start process 0 there, or give every process its address") from None
      time.sleep(0.2)
  with conn:
    _send(conn, mine)
    # Process 0 answers once every process is there, at its own deadline at the latest (it may have started later).
    answer = _read_line(conn, timeout_s + 60)
  if not isinstance(answer, dict) or answer.get("tag") != _TAG:
    raise UserError(f"process {mine['process_id']}: what answered at {where} is not process 0 waiting for its "
                    "processes: it stopped (see its output), it already has every process (is this --process_id "
                    "given twice?), or the port belongs to another program")
  if answer.get("problem"):
    raise UserError(f"process 0 refused this run: {answer['problem']}")


def mismatch(hello: dict, mine: dict) -> str | None:
  """The first fact a peer (`hello`) holds otherwise than process 0 (`mine`), in one line; None when they agree."""
  i = hello.get("process_id")
  if not isinstance(i, int) or not 0 < i < mine["num_processes"]:
    return (f"a process was started with --process_id={i} and --num_processes={hello.get('num_processes')}, "
            f"process 0 with --num_processes={mine['num_processes']}")
  for fact in FACTS:
    theirs, ours = hello.get(fact), mine.get(fact)
    if theirs == ours:
      continue
    if fact == "config":
      theirs, ours = theirs or {}, ours or {}
      key = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))[0]
      return (f"process {i} has config.{key}={theirs.get(key, '<missing>')} and process 0 "
              f"config.{key}={ours.get(key, '<missing>')}: start every process with the same --config and flags")
    if fact == "code":
      return (f"process {i} runs other glmrl code than process 0 (source digest of main.py, glmrl/ and configs/ "
              f"{theirs} vs {ours}): install the same version on every host")
    if fact == "versions":
      theirs, ours = theirs or {}, ours or {}
      package = sorted(p for p in set(theirs) | set(ours) if theirs.get(p) != ours.get(p))[0]
      return (f"process {i} has {package}=={theirs.get(package)} and process 0 {package}=={ours.get(package)}: "
              "install the same versions on every host (requirements.txt)")
    flag = "--workdir" if fact == "workdir" else f"--{fact}"
    return f"process {i} was started with {flag}={theirs} and process 0 with {flag}={ours}"
  return None


def _listen(port: int) -> socket.socket:
  """A listening socket on `port` of every interface (IPv4 and IPv6 where the host has both), as the coordinator's."""
  if socket.has_dualstack_ipv6():
    try:
      return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise
  return socket.create_server(("", port))


def _send(conn: socket.socket, message: dict) -> None:
  try:
    conn.sendall((json.dumps(message) + "\n").encode())
  except OSError:
    pass  # the peer went away; it says so itself


def _read_line(conn: socket.socket, timeout_s: float):
  """The JSON message of one line from `conn` within `timeout_s`; None on a timeout, EOF or anything else."""
  conn.settimeout(timeout_s)
  data = b""
  try:
    while not data.endswith(b"\n"):
      chunk = conn.recv(65536)
      if not chunk:
        break
      data += chunk
    return json.loads(data) if data.endswith(b"\n") else None
  except (OSError, ValueError):
    return None
