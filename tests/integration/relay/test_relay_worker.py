"""The relay worker and ``rqrelay``, the relay queue's small C script.

Real processes throughout: the compiled ``rqrelay`` run with the fds a queue
daemon gives a script (3: status pipe, 4: answers), the worker serving a
real unix socket, and, for its crash, ``rqsys serve`` relaying to a small RQ
peer in another network namespace while the worker is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS, need, wait_for
from netns import NetLab, Rqsys, netns_available

from rqsys.observe import timeline
from rqsys.scripts import relayworker
from rqsys.scripts.relay import RUN_MARK
from rqsys.special import special_config

SHIM = Path(relayworker.__file__).resolve().parent.parent / "_native" / "rqrelay"
PEER = HELPERS / "relay_peer.py"


def make_job(tmp_path: Path, msg: dict[str, Any]) -> Path:
    """A message directory as the daemon makes it; its ``job/``."""
    job = tmp_path / "msg" / "job"
    job.mkdir(parents=True)
    (job.parent / "msg").write_text(json.dumps(msg))
    return job


def run_shim(job: Path, argv: list[str], sock: str = "") -> tuple[int, str, str]:
    """Run rqrelay as the daemon would; (exit code, fd 3 lines, output)."""
    status_r, status_w = os.pipe()
    reply_r, reply_w = os.pipe()
    assert min(status_w, reply_r) > 4  # dup2 to 3 and 4 overwrites neither
    env = {"RQ_MSG_DIR": str(job), "RQ_WRITE": "3", "RQ_READ": "4",
           "RQ_HOST": "http://a.example:3333/", "PATH": os.environ["PATH"]}
    if sock:
        env["RQ_RELAY_SOCKET"] = sock
    with open(job / "stdio.log", "wb") as out:
        proc = subprocess.Popen([str(SHIM), *argv], env=env, cwd=job, stdout=out,
                                stderr=subprocess.STDOUT, close_fds=False,
                                preexec_fn=lambda: (os.dup2(status_w, 3), os.dup2(reply_r, 4)))
        os.close(status_w)
        os.close(reply_r)
        with os.fdopen(status_r) as status:
            lines = status.read()
        code = proc.wait(30)
    os.close(reply_w)
    return code, lines, (job / "stdio.log").read_text()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[str]:
    """A relay worker serving a unix socket on a thread of this process."""
    path = str(tmp_path / "worker.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    thread = threading.Thread(target=relayworker.Worker(listener).serve_forever, daemon=True)
    thread.start()
    yield path
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()


def test_shim_is_built() -> None:
    assert os.access(SHIM, os.X_OK), f"{SHIM} was not built (setup.py build_ext)"


def test_worker_relays_through_the_shim(tmp_path: Path, worker: str) -> None:
    # Given a message whose dest is no queue URL, and a worker
    job = make_job(tmp_path, {"dest": "http://x.example/nothing"})
    # When rqrelay hands it over (its fallback would say so on fd 3)
    code, lines, out = run_shim(job, ["/bin/sh", "-c", "echo 'done fallback ran' >&3"], worker)
    # Then the worker wrote RQ's err line on the shim's fd 3 and its output in stdio.log
    assert code == 0
    assert lines.startswith("err dest 'http://x.example/nothing' is not a queue URL")
    assert "err dest" in out and "fallback" not in lines


def test_worker_threads_are_reused(tmp_path: Path, worker: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker that served one message (its next accepting thread started)
    job = make_job(tmp_path, {"dest": "http://x.example/nothing"})
    run_shim(job, ["/bin/false"], worker)
    started: list[threading.Thread] = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda t: (started.append(t), start(t))[1])
    # When twenty more come one after the other, each is relayed...
    for _ in range(20):
        assert run_shim(job, ["/bin/false"], worker)[0] == 0
    # ...by the threads already there, not one new thread per message
    assert len(started) <= 1


def test_worker_first_thread_outlives_a_busy_spell(tmp_path: Path) -> None:
    # Given a worker whose serve_forever is a process's main loop
    path = str(tmp_path / "w.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        main = threading.Thread(target=relayworker.Worker(listener).serve_forever, daemon=True)
        main.start()
        # When eight connections are open at once, then all end (spare threads pile up)
        busy = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(8)]
        for conn in busy:
            conn.connect(path)
        for conn in reversed(busy):  # the first thread's (the first accepted) last
            conn.sendall(b"not a request\n")
            assert conn.recv(10) == b""  # refused and closed
            conn.close()
        # Then the first thread still serves (a process would end without it)
        run_shim(make_job(tmp_path, {"dest": "http://x.example/nothing"}), ["/bin/false"], path)
        assert main.is_alive()
        listener.shutdown(socket.SHUT_RDWR)
    main.join(10)
    assert not main.is_alive()


def test_without_a_worker_the_shim_runs_its_fallback(tmp_path: Path) -> None:
    job = make_job(tmp_path, {"dest": "http://x.example/q/w"})
    for sock in ("", str(tmp_path / "absent.sock")):
        code, lines, _ = run_shim(job, ["/bin/sh", "-c", "echo \"done fallback $0\" >&3; exit 3"],
                                  sock)
        assert (code, lines) == (3, "done fallback /bin/sh\n")


def test_shim_without_fallback_says_how_to_use_it(tmp_path: Path) -> None:
    job = make_job(tmp_path, {"dest": "http://x.example/q/w"})
    code, lines, out = run_shim(job, [])
    assert code == 127 and lines == ""
    assert "rqrelay: usage: rqrelay PYTHON relay.py" in out


@pytest.mark.parametrize("head, why", [
    (b"GET / HTTP/1.0\n", "not an rqrelay request"),
    (b"RQRELAY1 99999999999\n", "bad environment size"),
    (b"RQRELAY1 5\n", "0 fds passed, not 4"),
])
def test_worker_refuses_what_is_not_an_rqrelay_request(head: bytes, why: str,
                                                       capfd: pytest.CaptureFixture[str],
                                                       worker: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(worker)
        conn.sendall(head + b"12345")
        assert conn.recv(100) == b""  # closed without an answer
    wait_for(lambda: why in capfd.readouterr().err, 10, "the worker's complaint")


def test_environment_must_name_the_message() -> None:
    with pytest.raises(relayworker.BadRequest, match="no RQ_MSG_DIR"):
        relayworker.parse_environ(b"A=1\0B=2\0")


# ---------------------------------------------------------------- the worker dies
@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[Rqsys, Path, str]]:
    yield from lab_hosts(tmp_path, RELAY_HOLD_AT="uploaded")


@pytest.fixture
def handing_hosts(tmp_path: Path) -> Iterator[tuple[Rqsys, Path, str]]:
    yield from lab_hosts(tmp_path)


def lab_hosts(tmp_path: Path, **env: str) -> Iterator[tuple[Rqsys, Path, str]]:
    """a (rqsys serve, its relay queue's env_vars + ``env``, stop_grace 1 s) and
    an RQ peer on b."""
    need(netns_available(), "network namespaces need root and iproute2")
    lab = NetLab()
    try:
        lab.host("a")
        addr_b = lab.host("b")
        a = Rqsys(lab, "a", tmp_path / "a")
        cfg = special_config("relay")
        cfg["env_vars"] = {"BACKOFF_UNIT": "0.2", "BACKOFF_MAX": "2", "RELAY_TIMEOUT": "5",
                           **env}
        cfg["stop_grace"] = 1
        a.layout.create_queue_dir("relay", cfg)
        peer_dir = tmp_path / "peer"
        peer_dir.mkdir()
        lab.popen("b", [sys.executable, str(PEER), str(peer_dir), addr_b, "8080"])
        wait_for(lambda: (peer_dir / "ready").exists(), 15, "the RQ peer")
        a.start()
        yield a, peer_dir, f"http://{addr_b}:8080/q/work"
        a.stop()
    finally:
        lab.close()


def test_worker_killed_mid_relay_the_shim_finishes_it_alone(
        hosts: tuple[Rqsys, Path, str]) -> None:
    a, peer_dir, dest = hosts
    # Given a relay held by the worker after its prep (RELAY_HOLD_AT=uploaded)
    msg_id = a.call("relay", "create", msg={"dest": dest})["msg_id"]
    note = a.layout.queue_dir("relay") / "run" / msg_id / "job" / "held-uploaded"
    wait_for(lambda: note.exists() and note.read_text().strip(), 30, "the hold")
    shim_pid = int(note.read_text())
    assert Path(f"/proc/{shim_pid}/exe").resolve() == SHIM.resolve()
    # When the worker is SIGKILLed
    assert a.proc is not None
    os.kill(worker_pid(a.proc.pid), signal.SIGKILL)
    # Then the shim runs the relay itself, which resumes from relay_id: relayed, one copy
    got = wait_for(lambda: (g := a.call("relay", "get", msg_id=msg_id))["state"] == "relayed"
                   and g, 60, "relayed by the fallback")
    (far,) = sorted((peer_dir / "q" / "work").iterdir())
    assert got["status"].endswith(far.name)
    assert (far / "state").read_text() in ("que", "done")


@pytest.mark.parametrize("victim", ["worker", "daemon"])
def test_handed_relay_survives_its_worker_or_daemon_killed(
        handing_hosts: tuple[Rqsys, Path, str], victim: str) -> None:
    a, peer_dir, dest = handing_hosts
    assert a.proc is not None
    # Given a relay the daemon handed to the worker (no rqrelay process), its commit stalled
    (peer_dir / "faults.json").write_text('{"stall_commit": 1}')
    msg_id = a.call("relay", "create", msg={"dest": dest})["msg_id"]
    wait_for((peer_dir / "stalled").exists, 30, "the stalled commit")
    assert not [p for p in descendants(a.proc.pid) if exe(p) == SHIM.resolve()]
    # When the worker (or the relay queue's daemon) is SIGKILLed, and the far end answers 503
    pid = worker_pid(a.proc.pid) if victim == "worker" else a.call("relay", "ping")["pid"]
    os.kill(pid, signal.SIGKILL)
    (peer_dir / "unstall").write_text("1")
    # Then the message is relayed, resumed from relay_id: one copy, committed
    got = wait_for(lambda: (g := a.call("relay", "get", msg_id=msg_id))["state"] == "relayed"
                   and g, 60, "relayed after the kill")
    (far,) = sorted((peer_dir / "q" / "work").iterdir())
    assert got["status"].endswith(far.name) and (far / "state").read_text() == "que"
    log = next(a.layout.queue_dir("relay").rglob(f"{msg_id}/job/stdio.log")).read_text()
    assert log.count(RUN_MARK) == 2, log
    # And the handed run's start names the relay worker, not a pid it does not have
    events = timeline.read(next(a.layout.queue_dir("relay").rglob(f"relayed/*/{msg_id}")))
    first = next(e for e in events if e["ev"] == "started")
    assert first["handed"] == "relay worker" and "pid" not in first, first
    if victim == "worker":  # the daemon saw its hand-over dropped, and started the script
        assert "the relay worker went away" in json.dumps(got)


def test_handed_relay_that_times_out_is_err_and_never_committed(
        handing_hosts: tuple[Rqsys, Path, str]) -> None:
    a, peer_dir, dest = handing_hosts
    # Given a handed relay whose commit the far end stalls, past the message's timeout
    (peer_dir / "faults.json").write_text('{"stall_commit": 1}')
    msg_id = a.call("relay", "create", msg={"dest": dest, "timeout": 1})["msg_id"]
    try:
        # Then the daemon stops it (TERM: the worker is asked; KILL after stop_grace)
        got = wait_for(lambda: (g := a.call("relay", "get", msg_id=msg_id))["state"] == "err"
                       and g, 30, "the timed-out relay in err")
    finally:
        (peer_dir / "unstall").write_text("1")
    assert got["status"] == "timed out after 1 s"
    # And the worker let it go: the far copy stays prepared, never committed
    (far,) = sorted((peer_dir / "q" / "work").iterdir())
    assert (far / "state").read_text() == "prep"


def descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(pid))
    found, todo = [], [root]
    while todo:
        children = kids.get(todo.pop(), [])
        found += children
        todo += children
    return found


def exe(pid: int) -> Path | None:
    try:
        return Path(f"/proc/{pid}/exe").resolve()
    except OSError:
        return None


def worker_pid(supervisor: int) -> int:
    """The pid of the relay worker the supervisor started."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == supervisor and b"rqsys.scripts.relayworker" in cmd:
            return int(pid)
    raise AssertionError(f"supervisor {supervisor} runs no relay worker")


def test_relay_worker_command_needs_its_socket() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LISTEN_FDS", "LISTEN_PID")}
    done = subprocess.run([str(Path(sys.executable).parent / "rqsys"), "relay-worker"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "relay worker: no listening socket handed over (LISTEN_FDS)" in done.stderr


# ---------------------------------------------------------------- its HTTP client
@pytest.fixture
def canned() -> Iterator[tuple[str, list[bytes], list[bytes]]]:
    """A TCP server answering each request with the next canned answer (closing
    the connection where the next is ``b""``); (URL, answers, requests)."""
    answers: list[bytes] = []
    requests: list[bytes] = []
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while answers:
                    data = conn.recv(65536)
                    if not data:
                        break
                    requests.append(data)
                    conn.sendall(answers.pop(0))
                    if answers and not answers[0]:
                        answers.pop(0)
                        break

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", answers, requests
    server.close()


FAR = "http://b/q/w/20260101.0000.00.000.1"
OK = f'["ok", "{FAR}"]'.encode()


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK), OK),
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
    % (len(OK), OK),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" + OK[:5] + b"\r\n"
    + b"%x;ext=1\r\n" % (len(OK) - 5) + OK[5:] + b"\r\n0\r\nX-Trailer: 1\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + OK,
])
def test_http_client_reads_each_framing(canned: Any, answer: bytes) -> None:
    from rqsys.scripts.rqhttp import Peer

    url, answers, requests = canned
    answers += [answer, b""]
    assert Peer(url, 5).post_form(f"{url}/q/w/new_message", {"mesg": "{}"}) == FAR
    head, _, body = requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /q/w/new_message HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Length: %d" % len(body) in head and body == b"mesg=%7B%7D&x_format=json"


def test_http_client_retries_a_kept_alive_connection_the_far_end_closed(canned: Any) -> None:
    from rqsys.scripts.rqhttp import Connections, Peer

    url, answers, requests = canned
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    answers += [reply, b"", reply]  # the second request meets a closed connection
    peer = Peer(url, 5, Connections())
    assert peer.get_json(f"{url}/a.json") == {} and peer.get_json(f"{url}/b.json") == {}
    paths = [r.split(b" ")[1] for r in requests]
    assert paths[0] == b"/a.json" and paths[-1] == b"/b.json" and not answers
    assert len(peer.conns._idle[peer.key]) == 1  # the new connection, kept


@pytest.mark.parametrize("answer, why", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x answer"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "closed the connection"),
])
def test_http_client_refuses_what_it_cannot_read(canned: Any, answer: bytes, why: str) -> None:
    from rqsys.scripts.rqhttp import Peer, PeerError

    url, answers, _ = canned
    answers += [answer, b""]
    with pytest.raises(PeerError, match=why):
        Peer(url, 5).get_json(f"{url}/x.json")


def test_http_client_times_out_a_silent_far_end() -> None:
    from rqsys.scripts.rqhttp import Connections, Peer, PeerError

    # Given a far end that takes the connection and never answers
    with socket.create_server(("127.0.0.1", 0)) as server:
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        started = time.monotonic()
        # When a relay asks it something, Then the request times out, saying so
        with pytest.raises(PeerError, match="timed out"):
            Peer(url, 0.3, Connections()).get_json(f"{url}/x.json")
        assert time.monotonic() - started < 5
