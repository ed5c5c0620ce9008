"""DNS rebinding, on a real ``rqsys web``: a request whose Host is a DNS name
not of this server is refused 421 before anything is done (with no
basic_auth, the default on loopback, a rebound page could read and change
every queue: a review found it), while this server's names, IP addresses
and the names in ``allowed_hosts`` are served."""

from __future__ import annotations

import json

import pytest
from web_support import web_server  # noqa: F401

# ruff: noqa: F811  (the fixture imported above is a parameter here)


@pytest.fixture
def server(make_queue, daemon, web_server):
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    return proc, web_server(host="rq.example", allowed_hosts=["proxy.example"])


BROWSER = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}  # a rebound page's


def _create(web, host: str, browser: bool = True) -> tuple[int, bytes]:
    status, _h, data = web.request("POST", "/q/q/new_message", "mesg={}", {
        "Host": host, "Content-Type": "application/x-www-form-urlencoded",
        **(BROWSER if browser else {})})
    return status, data


def test_a_rebound_name_is_refused_before_anything_is_done(server):
    proc, web = server
    status, data = _create(web, f"attacker.example:{web.port}")
    assert status == 421 and b"is not a name of this server" in data, data
    status, _h, data = web.request("GET", "/q/q.json",
                                   headers={"Host": "attacker.example", **BROWSER})
    assert status == 421
    assert proc.call("counts")["counts"]["que"] == 0


def test_a_request_not_from_a_browser_may_use_any_name(server):
    # another host's relay or dependency check may know this host by a name it
    # does not know itself by (a CNAME): no page can have rebound it
    proc, web = server
    status, data = _create(web, f"rq-alias.example:{web.port}", browser=False)
    assert status == 200 and json.loads(data)[0] == "ok", data
    assert proc.call("counts")["counts"]["que"] == 1


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "[::1]:{port}", "localhost:{port}",
                                  "rq.example", "RQ.example.:{port}", "proxy.example"])
def test_this_servers_names_and_addresses_are_served(server, host):
    proc, web = server
    status, data = _create(web, host.format(port=web.port))
    assert status == 200 and json.loads(data)[0] == "ok", data
    assert proc.call("counts")["counts"]["que"] == 1
