"""rq-web's waitress skips its main-thread wake-up after a request that
leaves its keep-alive connection as it was (rqsys.web.onewrite.quiet_trigger),
and still wakes it whenever the main thread has something to notice: a real
waitress server from ``make_server`` on a real socket, a real falcon app."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import falcon
import pytest

from rqsys.web import app as webapp


class Echo:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"ok": True}


@pytest.fixture
def served() -> Iterator[tuple[int, list[int]]]:
    """(port, wake-ups): a server on loopback, its trigger's pulls counted."""
    app = falcon.App()
    app.add_route("/x", Echo())
    sock = socket.create_server(("127.0.0.1", 0))
    server = webapp.make_server(app, sock, {})
    pulls: list[int] = []
    real = server.trigger.pull_trigger

    def counted() -> None:
        pulls.append(1)
        real()

    server.trigger.pull_trigger = counted
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], pulls
    finally:
        server.close()  # ends run(): its map emptied
        thread.join(10)


def get(conn: http.client.HTTPConnection, **headers: Any) -> bytes:
    conn.request("GET", "/x", headers=headers)
    resp = conn.getresponse()
    assert resp.status == 200
    return resp.read()


def test_keep_alive_requests_are_answered_without_waking_the_main_thread(served):
    port, pulls = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    # Given a keep-alive connection, When 50 requests are made on it one by one
    for _ in range(50):
        assert get(conn) == b'{"ok": true}'
    # Then each is answered, and the main thread was woken for few of them (for
    # one whose next request was read before it ended: the main thread had
    # stopped reading, two requests being queued, and must start again)
    assert len(pulls) <= 40
    conn.close()


def test_a_closing_connection_still_wakes_the_main_thread(served):
    port, pulls = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    get(conn)
    before = len(pulls)
    # When the request asks to close, Then the main thread is told (it must close it)
    assert get(conn, Connection="close") == b'{"ok": true}'
    # (the worker thread pulls after it has sent the answer the client just read)
    deadline = time.monotonic() + 10
    while len(pulls) <= before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(pulls) > before


def test_pipelined_requests_are_answered_in_order(served):
    port, _pulls = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        request = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"
        sock.sendall(request * 3 + b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 4 and data.count(b'{"ok": true}') == 4
