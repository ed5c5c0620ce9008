"""Secure by default, with real processes: where ``rqsys serve`` / ``rqsys web`` listen,
the refusal of an open address without a password, ``rqsys passwd``, and what a
queue script inherits.

Non-loopback binds happen inside a fresh network namespace (``unshare -n``):
nothing outside this test can reach them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import argon2
import pytest
from conftest import need, wait_for
from daemon_util import job_file
from scan_util import LoggedProcess, call, clean_env, free_port, make_entry

from rqsys.errors import TooLarge
from rqsys.message import PARAM_MAX
from rqsys.store import Layout
from rqsys.web import auth, listen

RQSYS = [sys.executable, "-m", "rqsys"]
REFUSED = "without basic_auth"
WARNING = "without authentication (--allow-unauthenticated-network)"
# `rqsys web` handed a socket bound to 0.0.0.0, as systemd would hand one over
HANDED_OVER = ("import os, socket, sys; s = socket.create_server(('0.0.0.0', 0)); "
               "os.dup2(s.fileno(), 3) if s.fileno() != 3 else os.set_inheritable(3, True); "
               "os.environ.update(LISTEN_FDS='1', LISTEN_FDNAMES='web', "
               "LISTEN_PID=str(os.getpid())); "
               "os.execv(sys.executable, [sys.executable, '-m', 'rqsys', '--root', "
               "sys.argv[1], 'web', *sys.argv[2:]])")


def in_netns(argv: list[str]) -> list[str]:
    need(shutil.which("unshare") is not None and os.geteuid() == 0,
         "needs root and unshare(1) for a private network namespace")
    return ["unshare", "--net", "--", *argv]


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, _sep, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:
                found.add(addr)
    return found


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "config").mkdir(parents=True)
    return root


def write_config(root: Path, **cfg: object) -> None:
    (root / "config" / "config.json").write_text(json.dumps(cfg))


def serve_argv(root: Path, *extra: str) -> list[str]:
    scandir = root.parent / "scandir"
    scandir.mkdir(exist_ok=True)
    return [*RQSYS, "--root", str(root), "serve", "--scandir", str(scandir), *extra]


def test_listen_addresses_parse_and_loopback_is_recognised() -> None:
    assert listen.parse_listen("127.0.0.1:3333") == ("127.0.0.1", 3333)
    assert listen.parse_listen("[::1]:8080") == ("::1", 8080)
    assert listen.parse_listen(":80") == ("127.0.0.1", 80)
    for bad in ("127.0.0.1", "::1:3333", "h:0", "h:99999", "h:x", "[::1]3333"):
        with pytest.raises(listen.ConfigError):
            listen.parse_listen(bad)
    assert all(map(listen.is_loopback, ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"]))
    assert not any(map(listen.is_loopback, ["0.0.0.0", "::", "192.0.2.1", "example.org"]))


@pytest.mark.parametrize("listen_at", [None, "127.0.0.1", "[::1]"])
def test_serve_listens_on_loopback_only(root: Path, tmp_path: Path, listen_at: str | None
                                        ) -> None:
    # Given a root with no addr in config.json; When rqsys serve runs on a port
    # (by default, or told a loopback address)
    port = free_port()
    where = ["--port", str(port)] if listen_at is None else ["--listen", f"{listen_at}:{port}"]
    proc = LoggedProcess(serve_argv(root, *where), tmp_path / "serve.log",
                         clean_env(RQ_SOCKET_DIR=str(root / "sock")))
    try:
        proc.wait_log("rq-scan ready")
        # Then the web port listens on that loopback address and on no other
        expected = "00000000000000000000000001000000" if listen_at == "[::1]" else "0100007F"
        assert listening_addresses(port) == {expected}
    finally:
        assert proc.stop() == 0, proc.log()


def test_an_oversized_field_is_too_large_on_the_socket(make_queue, daemon) -> None:
    make_queue("q", 'echo "done ok" >&3\n')
    with pytest.raises(TooLarge, match=f"param2 too large: .* the limit is {PARAM_MAX} bytes"):
        daemon("q").call("create", msg={"param2": "x" * (PARAM_MAX + 1)})


def test_serve_refuses_an_open_address_without_a_password(root: Path) -> None:
    # When rqsys serve is asked to listen on every address, with no basic_auth
    done = subprocess.run(in_netns(serve_argv(root, "--listen", f"0.0.0.0:{free_port()}")),
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    # Then it ends non-zero with one line saying why and what to do, before starting anything
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert REFUSED in done.stderr and listen.ALLOW_FLAG in done.stderr
    assert not (root / "queue").exists() or not list((root / "queue").iterdir())


def test_serve_allowed_open_address_warns_at_start(root: Path, tmp_path: Path) -> None:
    # Given the operator's explicit flag; When serve listens on [::] in a private namespace
    argv = in_netns(serve_argv(root, "--listen", "[::]:3333", listen.ALLOW_FLAG))
    proc = LoggedProcess(argv, tmp_path / "serve.log", clean_env(RQ_SOCKET_DIR=str(root / "s")))
    try:
        # Then it starts, and the web logs the warning
        proc.wait_log("rq-scan ready")
        proc.wait_log(WARNING)
    finally:
        assert proc.stop() == 0, proc.log()


def test_a_handed_over_open_socket_is_checked_like_a_bound_one(root: Path) -> None:
    # Given a socket on 0.0.0.0 handed over as systemd would (rq-web.socket edited)
    write_config(root, host="127.0.0.1")
    argv = in_netns([sys.executable, "-c", HANDED_OVER, str(root)])
    # When rqsys web starts on it without basic_auth: refused, one line, exit 2
    done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "0.0.0.0" in done.stderr and REFUSED in done.stderr


def test_a_handed_over_open_socket_with_basic_auth_serves(root: Path, tmp_path: Path) -> None:
    # Given basic_auth with one hashed and one plain-text password
    users = {"alice": auth.hash_password("s3cret"), "bob": "plain"}
    write_config(root, host="127.0.0.1", basic_auth={"realm": "r", "users": users})
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify"))
        notify.settimeout(60)
        env = clean_env(NOTIFY_SOCKET=str(tmp_path / "notify"))
        proc = LoggedProcess(in_netns([sys.executable, "-c", HANDED_OVER, str(root)]),
                             tmp_path / "web.log", env)
        try:
            # Then the web serves (READY=1) on 0.0.0.0, and names the user whose
            # password is plain text, only that one
            assert "READY=1" in notify.recv(4096).decode().split("\n")
            log = proc.wait_log("user 'bob' has a plain-text password")
            assert "alice" not in log and REFUSED not in log
        finally:
            assert proc.stop() in (0, -signal.SIGTERM), proc.log()


def test_passwd_prints_an_argon2_hash_of_stdin(root: Path) -> None:
    # When a password arrives on stdin (not a terminal)
    done = subprocess.run([*RQSYS, "--root", str(root), "passwd", "carol"], input="pa ss\n",
                          capture_output=True, text=True, timeout=60)
    # Then the snippet to paste holds an argon2 hash of exactly that line
    assert done.returncode == 0, done.stderr
    hashed = json.loads(done.stdout)["basic_auth"]["users"]["carol"]
    assert hashed.startswith("$argon2id$") and "pa ss" not in done.stdout
    assert argon2.PasswordHasher().verify(hashed, "pa ss")
    empty = subprocess.run([*RQSYS, "passwd"], input="\n", capture_output=True, text=True,
                           timeout=60)
    assert empty.returncode == 1 and empty.stderr == "rqsys passwd: empty password\n"


def test_passwd_prints_a_role_and_queues_when_given(root: Path) -> None:
    done = subprocess.run([*RQSYS, "--root", str(root), "passwd", "--role", "viewer",
                           "--queues", "etl-*", "mail", "--", "vic"], input="pw\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)["basic_auth"]["users"]["vic"]
    assert set(entry) == {"password", "role", "queues"}
    assert entry["role"] == "viewer" and entry["queues"] == ["etl-*", "mail"]
    assert argon2.PasswordHasher().verify(entry["password"], "pw")
    bad = subprocess.run([*RQSYS, "passwd", "--role", "root", "vic"], input="pw\n",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'root'" in bad.stderr


class CountingHasher(argon2.PasswordHasher):
    calls = 0

    def verify(self, hash: str | bytes, password: str | bytes) -> bool:  # noqa: A002
        CountingHasher.calls += 1
        return bool(super().verify(hash, password))


def test_a_verified_password_is_remembered_briefly_and_a_wrong_one_never() -> None:
    verifier = auth.Verifier({"alice": auth.hash_password("right"), "bob": "plain"})
    verifier.hasher = CountingHasher()
    assert all(verifier.check("alice", "right") for _ in range(20))
    assert CountingHasher.calls == 1  # one argon2 run for a page's twenty requests
    assert not verifier.check("alice", "wrong") and not verifier.check("alice", "wrong")
    assert CountingHasher.calls == 3
    assert verifier.check("bob", "plain") and not verifier.check("bob", "plainx")
    assert not verifier.check("nobody", "right")


def test_queue_scripts_do_not_inherit_the_supervisor_pid(root: Path, tmp_path: Path) -> None:
    # Given rqsys serve with a queue whose script prints its environment
    layout = Layout(root, root / "sock")
    make_entry(root.parent / "scandir", "envq", 'env; echo "done ok" >&3')
    proc = LoggedProcess(serve_argv(root, "--port", str(free_port())), tmp_path / "serve.log",
                         clean_env(RQ_SOCKET_DIR=str(layout.socket_dir)))
    try:
        proc.wait_log("rq-scan ready")
        # When a message runs
        msg_id = call(layout, "envq", "create", msg={"param1": "x"})["msg_id"]
        wait_for(lambda: call(layout, "envq", "state", msg_id=msg_id)["state"] == "done", 60)
        # Then its script saw RQ's variables, and not the supervisor's pid
        log = job_file(layout, "envq", msg_id, "stdio.log").read_text()
        assert "RQ_PARAM1=x" in log and "RQ_SUPERVISOR_PID" not in log
    finally:
        assert proc.stop() == 0, proc.log()


def test_web_on_a_busy_address_is_one_line(root: Path) -> None:
    # Given another program listening on the loopback port asked for
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        # When rqsys web (no socket handed over) is told to listen there
        done = subprocess.run([*RQSYS, "--root", str(root), "web", "--listen",
                               f"127.0.0.1:{port}"], env=clean_env(), capture_output=True,
                              text=True, timeout=60)
    # Then one line names the address and why, and the exit status is 2
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == f"rqsys web: cannot listen on 127.0.0.1:{port}: address already in use\n"
