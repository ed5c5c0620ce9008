"""A create's remote ``after`` URLs are asked in parallel, within one deadline,
on a real daemon against a real (slow) HTTP host: asked one after another
they took longer than the client waits, which heard "timed out" while the
message was made later, and its retry made it twice (a review found it)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rqsys.errors import Unavailable


@pytest.fixture
def slow_host():
    """An RQ host on 127.0.0.1 whose state.json answers ["ok", "que"] after
    ``server.delay`` seconds."""
    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            time.sleep(server.delay)
            body = b'["ok", "que"]'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    server.delay = 0.0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _urls(server, n: int) -> list[str]:
    return [f"http://127.0.0.1:{server.server_port}/q/far/20261124.1200.00.000.{i}"
            for i in range(n)]


def test_many_slow_hosts_are_asked_at_once(make_queue, daemon, slow_host):
    # Given forty remote dependencies whose host takes 1.5 s to answer each
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    slow_host.delay = 1.5
    # When a message waiting for them is created
    began = time.monotonic()
    got = proc.call("create", msg={"after": _urls(slow_host, 40)})
    # Then it is answered once all have (one after another: 60 s)
    assert got["ok"] and time.monotonic() - began < 8
    assert proc.call("counts")["counts"]["que"] == 1


def test_hosts_that_answer_too_late_refuse_the_create(make_queue, daemon, slow_host):
    # Given a deadline of one second for the checks, and a host taking five
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q", env={"RQ_AFTER_CHECK_DEADLINE": "1"})
    proc.call("adminoper", oper="pause")
    slow_host.delay = 5
    # When a message waiting for its messages is created, Then it is refused in
    # time, and nothing is made (a retry cannot make it twice)
    began = time.monotonic()
    with pytest.raises(Unavailable, match="did not answer in time|could not be checked"):
        proc.call("create", msg={"after": _urls(slow_host, 3)})
    assert time.monotonic() - began < 4
    time.sleep(5)  # past the host's answers
    assert proc.call("counts")["counts"]["que"] == 0
