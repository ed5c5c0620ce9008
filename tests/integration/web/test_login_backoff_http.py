"""Failed logins back off over real HTTP (a real ``rqsys web``, argon2 hashes):
429 with Retry-After for the guessing address, the right password from another
address let in meanwhile, the counts in ``/metrics``, the lines in the web's
log (never a password), undecodable credentials counted and answered 401.

Each client binds its own loopback address (127.0.0.1, .2, .3) before it
connects: the web sees a different peer address, as it would another host."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import base64
import http.client
import json
import re
import time

import pytest
from web_support import web_server  # noqa: F401

from rqsys.web import auth
from rqsys.web.backoff import PAIR_FREE

RIGHT = "right horse battery"
GUESS = "guess-{}-staple"  # every wrong password sent, numbered: none may reach the log


@pytest.fixture
def server(web_server):
    return web_server(basic_auth={"realm": "rq", "users": {"alice": auth.hash_password(RIGHT)}})


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def get(server, source: str, headers: dict[str, str], path: str = "/q.json"):
    """GET ``path`` from the client address ``source``: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60,
                                      source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def _guess(server, source: str, n: int) -> tuple[int, str | None]:
    status, headers, _body = get(server, source, _basic("alice", GUESS.format(n)))
    return status, headers.get("Retry-After")


def _metric(text: str, name: str, label: str) -> float:
    found = re.search(rf"^{name}\{{{label}\}} (\S+)$", text, re.M)
    assert found, (name, label)
    return float(found.group(1))


def test_guesses_back_off_per_address_and_the_right_password_elsewhere_is_let_in(server):
    # Given ten wrong passwords for alice from 127.0.0.1, each answered 401
    assert [_guess(server, "127.0.0.1", n)[0] for n in range(PAIR_FREE)] == [401] * PAIR_FREE
    # When it tries again at once
    status, headers, body = get(server, "127.0.0.1", _basic("alice", GUESS.format(10)))
    # Then it is told to wait, with Retry-After in seconds, in RQ's error format
    assert status == 429 and headers["Retry-After"] == "1"
    assert json.loads(body) == ["fail", "too many failed logins: try again in 1 s"]
    # and even the right password from there waits
    assert get(server, "127.0.0.1", _basic("alice", RIGHT))[0] == 429
    # while alice's right password from another address is let in at once
    status, _h, body = get(server, "127.0.0.2", _basic("alice", RIGHT))
    assert status == 200 and json.loads(body) == []
    assert _guess(server, "127.0.0.1", 11) == (429, "1")  # the first still waits
    # After the wait, one more try is let in (and checked: 401), then the wait doubles
    time.sleep(1.1)
    assert _guess(server, "127.0.0.1", 12) == (401, None)
    assert _guess(server, "127.0.0.1", 13) == (429, "2")
    time.sleep(2.1)
    assert get(server, "127.0.0.1", _basic("alice", RIGHT))[0] == 200  # which clears it
    assert [_guess(server, "127.0.0.1", 20 + n)[0] for n in range(3)] == [401] * 3


@pytest.mark.parametrize("header", ["Basic !!!", "Basic " + base64.b64encode(b"\xff\xfe").decode()])
def test_undecodable_credentials_are_counted_failures_not_errors(server, header):
    for _ in range(PAIR_FREE):
        status, got, body = get(server, "127.0.0.3", {"Authorization": header})
        assert status == 401 and got["WWW-Authenticate"] == 'Basic realm="rq"'
        assert json.loads(body)[0] == "fail"
    status, got, _body = get(server, "127.0.0.3", {"Authorization": header})
    assert status == 429 and got["Retry-After"] == "1"
    status, _h, data = get(server, "127.0.0.1", _basic("alice", RIGHT), "/metrics")
    assert status == 200
    text = data.decode()
    assert _metric(text, "rqsys_http_login_failures_total", 'reason="malformed"') == PAIR_FREE
    assert _metric(text, "rqsys_http_login_refused_total", 'scope="user_address"') == 1
    assert server.proc.poll() is None  # and the web is still up


def test_metrics_count_and_the_log_says_who_but_never_the_password(server):
    # Given eleven guesses from 127.0.0.1 (the last one refused), alice from
    # 127.0.0.2, and a made-up name from 127.0.0.3
    for n in range(PAIR_FREE + 1):
        _guess(server, "127.0.0.1", n)
    assert get(server, "127.0.0.2", _basic("alice", RIGHT))[0] == 200
    assert get(server, "127.0.0.3", _basic("mallory\n", GUESS.format(99)))[0] == 401
    # Then /metrics counts them, labelled by reason and scope only
    status, _h, data = get(server, "127.0.0.2", _basic("alice", RIGHT), "/metrics")
    text = data.decode()
    assert status == 200
    assert _metric(text, "rqsys_http_login_failures_total", 'reason="password"') == PAIR_FREE
    assert _metric(text, "rqsys_http_login_failures_total", 'reason="user"') == 1
    assert _metric(text, "rqsys_http_login_failures_total", 'reason="malformed"') == 0
    assert _metric(text, "rqsys_http_login_refused_total", 'scope="user_address"') == 1
    assert _metric(text, "rqsys_http_login_refused_total", 'scope="address"') == 0
    assert _metric(text, "rqsys_http_login_backoffs_total", 'scope="user_address"') == 1
    assert "127.0.0" not in text and "alice" not in text and "mallory" not in text
    # And the web's log has a line per failure and one for the backoff
    server.stop()
    log = server.proc.stderr.read()
    lines = [line for line in log.splitlines() if "login" in line]
    failed = "rqsys web: login failed: user 'alice' from 127.0.0.1 (wrong password)"
    assert lines.count(failed) == PAIR_FREE
    assert ("rqsys web: login backoff: user 'alice' from 127.0.0.1: 10 failures, refused for 1 s"
            in lines)
    assert "rqsys web: login failed: user 'mallory\\n' from 127.0.0.3 (no such user)" in lines
    assert len(lines) == PAIR_FREE + 2  # no line for the refused try, none for alice's success
    assert "guess-" not in log and "staple" not in log and RIGHT not in log
