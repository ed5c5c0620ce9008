"""listen_unix: a socket file appears only once something listens on it.

The race test runs the client in another process (not a thread: the GIL
would serialise it with bind and listen), connecting in a tight loop while
the socket is made, and counts any ECONNREFUSED — what a client reads as
"queue not running".
"""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rqsys.unixsock import listen_unix

ROUNDS = 500
MAX_PATH = 107  # sun_path is 108 bytes with the terminating NUL

# Spins on connect() to <dir>/s<i>.sock for each round i, after saying "i" on
# stdout; a round ends at the first connection.  One socket is retried until
# it connects, so each try costs one system call and a short window is seen.
# Prints how many tries were refused.
PROBE = r"""
import socket, sys
base, rounds = sys.argv[1], int(sys.argv[2])
refused = 0
for i in range(rounds):
    print(i, flush=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        while True:
            try:
                sock.connect(f"{base}/s{i}.sock")
                break
            except FileNotFoundError:
                continue
            except ConnectionRefusedError:
                refused += 1
print(f"refused {refused}", flush=True)
"""


def connects(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        return True


def test_a_client_connecting_in_a_tight_loop_is_never_refused(tmp_path: Path) -> None:
    # Given a client process trying to connect to each path before it exists
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(tmp_path), str(ROUNDS)],
                             stdout=subprocess.PIPE, text=True)
    assert probe.stdout is not None
    socks = []
    try:
        for i in range(ROUNDS):
            # When the socket is made while the client spins on its path
            assert probe.stdout.readline().strip() == str(i)
            socks.append(listen_unix(tmp_path / f"s{i}.sock"))
        last = probe.stdout.readline().strip()
        assert probe.wait(60) == 0
    finally:
        probe.kill()
        probe.wait()
        for sock in socks:
            sock.close()
    # Then every connection was accepted; none was refused
    assert last == "refused 0"


def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    # Given the file of a socket whose process died (nothing listens on it)
    path = tmp_path / "q.sock"
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.bind(str(path))
    old.close()
    with pytest.raises(ConnectionRefusedError):
        connects(path)
    # When a new socket is made at that path
    with listen_unix(path):
        # Then clients reach it, and no temporary name is left beside it
        assert connects(path)
        assert [p.name for p in tmp_path.iterdir()] == ["q.sock"]


def test_a_path_of_the_longest_length_works(tmp_path: Path) -> None:
    # Given a socket path that uses all of sun_path
    path = tmp_path / ("q" * (MAX_PATH - len(str(tmp_path)) - 1))
    assert len(str(path)) == MAX_PATH
    # When the socket is made there
    with listen_unix(path):
        # Then clients reach it, and no temporary name is left beside it
        assert connects(path)
        assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_failure_after_bind_removes_the_temporary_name(tmp_path: Path) -> None:
    # Given a non-empty directory where the socket should go (the rename fails)
    path = tmp_path / "q.sock"
    path.mkdir()
    (path / "keep").write_text("")
    # When the socket is made there
    with pytest.raises(OSError):
        listen_unix(path).close()
    # Then the error is raised and nothing but the directory is left
    assert [p.name for p in tmp_path.iterdir()] == ["q.sock"]
    assert [p.name for p in path.iterdir()] == ["keep"]


def test_a_longest_path_with_a_short_name_works(tmp_path: Path) -> None:
    # Given a 107-byte path whose last part is short (the temporary name is longer)
    deep = tmp_path / ("d" * (MAX_PATH - len(str(tmp_path)) - len("/q.sock") - 1))
    path = deep / "q.sock"
    assert len(str(path)) == MAX_PATH
    # When the socket is made there
    with listen_unix(path):
        # Then clients reach it, and only it is in its directory
        assert connects(path)
        assert [p.name for p in deep.iterdir()] == ["q.sock"]


def test_a_path_too_long_to_connect_to_is_refused(tmp_path: Path) -> None:
    # Given a path one byte longer than any client could connect to
    path = tmp_path / ("q" * (MAX_PATH + 1 - len(str(tmp_path)) - 1))
    assert len(str(path)) == MAX_PATH + 1
    # When the socket is made there, Then it is refused and nothing is left
    with pytest.raises(OSError) as caught:
        listen_unix(path).close()
    assert caught.value.errno == errno.ENAMETOOLONG
    assert list(tmp_path.iterdir()) == []
