"""Live parts pushed (issue 48): ``/live`` streams of a real ``rqsys web``
(waitress) over real sockets: the first tag, ``changed`` when the page
does, refused past MAX_STREAMS (the tab polls), bad pages and rates
refused, and pages and the API answered as fast with 20 streams open."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import http.client
import socket
import statistics
import time
from urllib.parse import quote

from daemon_util import send, settle
from web_support import web_server  # noqa: F401

from rqsys.web.live import MAX_STREAMS


def _open(port: int, page: str = "/", every: int = 1) -> tuple[socket.socket, bytes]:
    """A stream opened as a browser opens it; its head and first event."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET /live?page={quote(page)}&every={every} HTTP/1.1\r\n"
                 "Host: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode())
    got = b""
    while b"event: tag" not in got and b"HTTP/1.1 503" not in got:
        more = sock.recv(65536)
        if not more:
            break
        got += more
    return sock, got


def _events_until(sock: socket.socket, word: bytes, seconds: float) -> bytes:
    sock.settimeout(0.5)
    got, end = b"", time.monotonic() + seconds
    while word not in got and time.monotonic() < end:
        try:
            got += sock.recv(65536)
        except TimeoutError:
            continue
    return got


def _timed(port: int, path: str, rounds: int = 15) -> float:
    took = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _n in range(rounds):
        began = time.perf_counter()
        conn.request("GET", path, headers={"Accept": "text/html"})
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 200, path
        took.append(time.perf_counter() - began)
    conn.close()
    return statistics.median(took)


def test_a_stream_says_when_its_page_changes(make_queue, daemon, web_server):
    make_queue("etl", "echo done >&3")
    proc = daemon("etl")
    server = web_server()
    sock, head = _open(server.port, "/q/etl?state=done", every=1)
    try:
        assert b"HTTP/1.1 200" in head and b"text/event-stream" in head
        assert b"retry: 5000" in head and b"event: tag" in head
        settle(proc, send(proc))
        changed = _events_until(sock, b"event: changed", 10)
        assert b"event: changed\ndata: \"" in changed
    finally:
        sock.close()


def test_bad_pages_and_rates_are_refused(web_server):
    server = web_server()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for query in ("page=https://evil.example/&every=5", "page=/static/rq.js&every=5",
                  "page=/&every=0", "page=/&every=16", "page=/&every=x", "every=5"):
        conn.request("GET", "/live?" + query)
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 400, query


def test_past_the_limit_a_tab_is_told_to_poll_and_pages_stay_fast(make_queue, daemon,
                                                                  web_server):
    make_queue("etl", "echo done >&3")
    daemon("etl")
    server = web_server()
    before = {path: _timed(server.port, path) for path in ("/", "/q.json", "/q/etl")}
    streams = [_open(server.port, "/", every=1) for _n in range(20)]
    try:
        assert all(b"event: tag" in head for _s, head in streams)
        time.sleep(2)  # each stream renders its page every second meanwhile
        during = {path: _timed(server.port, path) for path in ("/", "/q.json", "/q/etl")}
        for path in before:  # not queued behind the streams: the same order of time
            assert during[path] < max(4 * before[path], before[path] + 0.05), (path, before,
                                                                              during)
        more = [_open(server.port, "/", every=5) for _n in range(MAX_STREAMS - 20)]
        streams += more
        assert all(b"event: tag" in head for _s, head in more)
        refused, head = _open(server.port, "/", every=5)
        refused.close()
        assert b"HTTP/1.1 503" in head
    finally:
        for sock, _head in streams:
            sock.close()
    # closed tabs give their places back (noticed at their next event)
    deadline = time.monotonic() + 30
    while True:
        sock, head = _open(server.port, "/", every=5)
        sock.close()
        if b"event: tag" in head:
            break
        assert time.monotonic() < deadline, head
        time.sleep(1)
