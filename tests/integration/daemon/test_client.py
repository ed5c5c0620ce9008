"""QueueClient against a real listening socket: timeouts kept by the kernel
(SO_RCVTIMEO, no poll before each call), and a stream handed over blocking."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from rqsys.errors import Unavailable
from rqsys.store import Layout
from rqsys.unixsock import listen_unix
from rqsys.wire.client import QueueClient


@pytest.fixture
def silent_daemon(tmp_path: Path):
    """A 'daemon' socket that accepts connections and never answers."""
    layout = Layout(tmp_path / "root", tmp_path / "sock")
    layout.make_dirs()
    layout.socket_dir.mkdir()
    (layout.queue_dir("q")).mkdir(parents=True)
    listener = listen_unix(layout.socket_path("q"))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield layout
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def test_a_daemon_that_never_answers_times_out_as_unavailable(silent_daemon):
    # Given a client with a short timeout, whose socket is blocking
    with QueueClient(silent_daemon, "q", timeout=0.3) as client:
        started = time.monotonic()
        # When the daemon never answers, Then the call ends after the timeout
        # with the old message, not a raw EAGAIN
        with pytest.raises(Unavailable, match=r"^queue q: timed out$"):
            client.call("ping")
        assert 0.25 < time.monotonic() - started < 5


def test_a_stream_is_handed_over_without_a_kernel_timeout(silent_daemon):
    # Given a watch stream opened with a short client timeout
    sock = QueueClient(silent_daemon, "q", timeout=0.3).open_stream("watch", msg_id="x")
    try:
        # Then the kernel timeout is off, and Python's settimeout rules the socket
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == bytes(16)
        assert sock.gettimeout() == 0.3
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(10)
    finally:
        sock.close()
