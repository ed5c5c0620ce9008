"""rq-web runs a lone keep-alive client's small enqueue on waitress's main
thread (rqsys.web.inline) and every other request on its worker threads: a
real waitress server from ``make_server`` on a real socket, a real falcon app
that records which thread served each request."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator

import falcon
import pytest

from rqsys.web import app as webapp
from rqsys.web.inline import INLINE_MAX_BODY


class Recorder:
    """Answers like new_message (["ok", ...]) and names the thread that served it."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        req.bounded_stream.read()
        resp.media = ["ok", threading.current_thread().name]

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        resp.media = ["ok", threading.current_thread().name]


@pytest.fixture
def port() -> Iterator[int]:

    app = falcon.App()
    app.add_route("/q/{name}/new_message", Recorder())
    app.add_route("/q/{name}/other", Recorder())
    sock = socket_on_loopback()
    server = webapp.make_server(app, sock, {})
    thread = threading.Thread(target=server.run, name="main-loop", daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        server.close()
        thread.join(10)


def socket_on_loopback():  # type: ignore[no-untyped-def]
    import socket
    return socket.create_server(("127.0.0.1", 0))


def served_by(conn: http.client.HTTPConnection, method: str = "POST",
              path: str = "/q/x/new_message", body: bytes = b"mesg=%7B%7D") -> str:
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    conn.request(method, path, body if method == "POST" else None, headers)
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status == 200, data
    assert resp.getheader("Content-Length") == str(len(data))
    return str(http_json(data)[1])


def http_json(data: bytes) -> list[object]:
    import json
    got = json.loads(data)
    assert isinstance(got, list)
    return got


def test_a_lone_clients_enqueues_run_on_the_main_thread(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    # Given one keep-alive client, When it enqueues again and again
    # Then each answer is whole and the main loop's thread made it
    assert {served_by(conn) for _ in range(20)} == {"main-loop"}
    conn.close()


def test_other_requests_and_big_bodies_go_to_the_workers(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert served_by(conn, "GET").startswith("waitress-")
    assert served_by(conn, path="/q/x/other").startswith("waitress-")
    big = b"mesg=" + b"x" * INLINE_MAX_BODY
    assert served_by(conn, body=big).startswith("waitress-")
    # and the connection goes on, soon inline again (a request read while the
    # worker's was ending is started by that worker, as waitress does)
    assert "main-loop" in {served_by(conn) for _ in range(5)}
    conn.close()


def test_a_second_connection_sends_every_enqueue_to_the_workers(port):
    first = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert served_by(first) == "main-loop"
    second = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    # When a second client is connected (and has been accepted)
    assert served_by(second).startswith("waitress-")
    # Then neither's enqueue holds up the main thread any more
    for _ in range(5):
        assert served_by(first).startswith("waitress-")
        assert served_by(second).startswith("waitress-")
    first.close()
    second.close()
