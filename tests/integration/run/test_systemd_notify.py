"""rqsys.systemd against real sockets: NOTIFY_SOCKET bound here, fds handed over by exec.

systemd is played as nobodd's tests play it: a datagram socket bound in a
temporary directory is named in NOTIFY_SOCKET and read as systemd would read
it; sockets are handed to a real child process as fd 3 with LISTEN_PID set
to the child's own pid (``bash -c 'LISTEN_PID=$$ exec python ...'``), exactly
what our supervisor and systemd do.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rqsys.systemd import Notifier, child_environ
from rqsys.unixsock import listen_unix

SYSTEMD_VARS = ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
                "WATCHDOG_USEC", "WATCHDOG_PID")


@pytest.fixture
def notify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket named in NOTIFY_SOCKET, as systemd binds one for a unit."""
    for var in SYSTEMD_VARS:
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def received(sock: socket.socket) -> list[str]:
    """Every datagram waiting on ``sock`` (none wait: an empty list)."""
    found, timeout = [], sock.gettimeout()
    sock.setblocking(False)
    try:
        while True:
            found.append(sock.recv(4096).decode())
    except BlockingIOError:
        return found
    finally:
        sock.settimeout(timeout)


def test_ready_status_and_stopping_reach_the_notify_socket(notify: socket.socket) -> None:
    notifier = Notifier()
    notifier.ready("3 queues")
    assert notify.recv(4096).decode() == "READY=1\nSTATUS=3 queues"
    notifier.status("1 running")
    notifier.status("1 running")  # unchanged: not sent again
    notifier.status("2 running")
    notifier.stopping()
    assert received(notify) == ["STATUS=1 running", "STATUS=2 running", "STOPPING=1"]


def test_reloading_carries_the_monotonic_time(notify: socket.socket) -> None:
    Notifier().reloading()
    lines = notify.recv(4096).decode().split("\n")
    assert lines[0] == "RELOADING=1"
    assert lines[1].startswith("MONOTONIC_USEC=") and int(lines[1].split("=")[1]) > 0


def test_an_abstract_notify_socket_is_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"rqsys-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        notifier = Notifier()
        notifier.ready()
        notifier.status("up")
        assert [sock.recv(4096).decode(), sock.recv(4096).decode()] == ["READY=1", "STATUS=up"]


def test_without_a_notify_socket_nothing_fails(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    Notifier().ready("x")
    Notifier().status("x")
    # and a NOTIFY_SOCKET nobody listens on is the same as none
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody"))
    Notifier().ready("x")
    Notifier().stopping()


def test_a_reader_that_fell_behind_never_blocks_the_sender(notify: socket.socket) -> None:
    # Given a notify socket nobody reads (its queue fills after a few datagrams)
    # When a real process sends far more status lines than fit, then stops
    code = "from rqsys.systemd import Notifier\nn = Notifier()\n" \
           "for i in range(200): n.status(str(i))\nn.stopping()\nprint('done')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    # Then it finished, and the lines that fitted arrived in order
    assert done.stdout == "done\n", done.stderr
    lines = received(notify)
    assert lines and lines == [f"STATUS={i}" for i in range(len(lines))]


def test_the_watchdog_is_due_every_half_interval(monkeypatch: pytest.MonkeyPatch,
                                                 notify: socket.socket) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = Notifier()
    notifier.kick_watchdog(100.0)
    assert notify.recv(4096).decode() == "WATCHDOG=1"
    assert notifier.watchdog_due(101.0) == 1.0
    notifier.kick_watchdog(101.0)  # not due yet: nothing sent
    notifier.kick_watchdog(102.0)
    assert received(notify) == ["WATCHDOG=1"]


def test_a_watchdog_meant_for_another_process_is_ignored(monkeypatch: pytest.MonkeyPatch,
                                                         notify: socket.socket) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert Notifier().watchdog_due(0.0) is None


def test_children_do_not_inherit_the_hand_over() -> None:
    base = {var: "x" for var in SYSTEMD_VARS} | {"PATH": "/bin", "RQ_IDLE_TIMEOUT": "5"}
    assert child_environ(base) == {"PATH": "/bin", "RQ_IDLE_TIMEOUT": "5"}


# The child: takes its sockets, says what it got, then serves one connection.
CHILD = textwrap.dedent("""\
    import json, os
    from rqsys.systemd import listen_sockets
    socks = listen_sockets()
    print(json.dumps({"names": sorted(socks),
                      "left": [v for v in os.environ if v.startswith("LISTEN_")],
                      "inheritable": [os.get_inheritable(s.fileno()) for s in socks.values()]}),
          flush=True)
    for sock in socks.values():
        conn, _ = sock.accept()
        conn.sendall(b"hello")
        conn.close()
""")


def hand_over(sock: socket.socket, listen_pid: str, **extra: str) -> subprocess.Popen[str]:
    """Run CHILD with ``sock`` as fd 3 and LISTEN_FDS=1, as systemd would."""
    env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_VARS}
    env.update(LISTEN_FDS="1", **extra)
    script = f'LISTEN_PID={listen_pid} exec "$0" -c "$1" 3<&{sock.fileno()}'
    return subprocess.Popen(["bash", "-c", script, sys.executable, CHILD], env=env,
                            pass_fds=(sock.fileno(),), stdout=subprocess.PIPE, text=True)


def child_report(child: subprocess.Popen[str]) -> dict[str, list[object]]:
    assert child.stdout is not None
    return dict(json.loads(child.stdout.readline()))


@pytest.mark.parametrize(("fdnames", "name"), [("q.sock", "q.sock"), (None, "fd0")])
def test_a_handed_over_socket_is_found_by_name_and_serves(tmp_path: Path, fdnames: str | None,
                                                          name: str) -> None:
    # Given a listening socket handed to a child as fd 3 (named, or not)
    path = tmp_path / "q.sock"
    with listen_unix(path) as sock:
        child = hand_over(sock, "$$", **({"LISTEN_FDNAMES": fdnames} if fdnames else {}))
        try:
            # Then the child finds it under its name, with LISTEN_* gone and close-on-exec
            report = child_report(child)
            assert report == {"names": [name], "left": [], "inheritable": [False]}
            # and serves on it
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(str(path))
                assert client.recv(5) == b"hello"
            assert child.wait(30) == 0
        finally:
            child.kill()
            child.wait()


def test_sockets_meant_for_another_process_are_not_taken(tmp_path: Path) -> None:
    # Given fd 3 handed over with LISTEN_PID naming some other process
    with listen_unix(tmp_path / "q.sock") as sock:
        child = hand_over(sock, str(os.getpid()), LISTEN_FDNAMES="q.sock")
        try:
            # Then the child takes nothing, and still drops LISTEN_*
            assert child_report(child) == {"names": [], "left": [], "inheritable": []}
            assert child.wait(30) == 0
        finally:
            child.kill()
            child.wait()
