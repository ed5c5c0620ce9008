"""Where a request comes from, in process: a browser's cross-site change is
403 (rqsys.web.csrf), a browser naming another host 421 (rqsys.web.hostnames),
both before any daemon is asked; the same site's pages, a name of this
server, an address, and clients that are no browser pass."""

from __future__ import annotations

import pytest
import webfakes
from webfakes import HOST, FakeDaemons, Served

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
PATH = "/q/etl-1/new_message"
CROSS = "changes come only from this site's own pages"


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> Served:
    return webfakes.served(tmp_path_factory.mktemp("web"), allowed_hosts=["rq.example.org"])


@pytest.fixture
def daemons(web) -> FakeDaemons:
    return web.daemons.reset()


@pytest.fixture
def client(web, daemons):
    return web.client


def post(client, **headers: str):
    return client.simulate_post(PATH, body="mesg={}", headers={**FORM, **headers})


# ---------------------------------------------------------------- cross-site
@pytest.mark.parametrize(("headers", "why"), [
    ({"Origin": "http://evil.example"},
     f"Origin 'http://evil.example' is not this site ('localhost'): {CROSS}"),
    ({"Origin": "null"}, f"Origin 'null' is not this site ('localhost'): {CROSS}"),
    ({"Origin": "http://localhost:8080"},
     f"Origin 'http://localhost:8080' is not this site ('localhost'): {CROSS}"),
    ({"Sec-Fetch-Site": "cross-site"}, f"Sec-Fetch-Site is 'cross-site': {CROSS}"),
    ({"Sec-Fetch-Site": "same-site", "Origin": "http://localhost"},
     f"Sec-Fetch-Site is 'same-site': {CROSS}"),
])
def test_a_cross_site_change_is_refused_before_any_daemon(client, daemons, headers, why):
    got = post(client, **headers)
    assert got.status_code == 403
    assert got.json == ["fail", f"cross-site request refused: {why}"]
    assert daemons.calls == []


@pytest.mark.parametrize("headers", [
    {"Origin": "http://localhost"}, {"Origin": "HTTP://LOCALHOST"},
    {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"},
    {"Sec-Fetch-Site": "same-origin", "Origin": "http://evil.example"},  # the newer header rules
    {},  # no browser: curl, RQ's clients
])
def test_a_same_origin_change_or_one_from_no_browser_is_made(client, daemons, headers):
    assert post(client, **headers).status_code == 200
    assert daemons.ops() == [("etl-1", "create")]


def test_a_cross_site_read_is_answered(client, daemons):
    got = client.simulate_get("/q/etl-1/messages.json", headers={"Sec-Fetch-Site": "cross-site"})
    assert got.status_code == 200


# ---------------------------------------------------------------- Host (DNS rebinding)
def test_a_browser_naming_another_host_is_421_before_any_daemon(client, daemons):
    got = post(client, Host="attacker.example:3333", Origin="http://attacker.example:3333")
    assert got.status_code == 421
    assert got.json == ["fail", "not this server's name: Host 'attacker.example:3333' is not a "
                                "name of this server: add it to allowed_hosts in config.json if "
                                "it is"]
    assert daemons.calls == []


@pytest.mark.parametrize("host", ["localhost:3333", f"{HOST}:3333", "RQ.example.org.",
                                  "127.0.0.1:3333", "[::1]:3333", "192.0.2.4"])
def test_a_name_of_this_server_or_an_address_is_served_to_a_browser(client, host):
    got = client.simulate_get("/q.json", headers={"Host": host, "Sec-Fetch-Site": "none"})
    assert got.status_code == 200, got.text


def test_a_client_that_is_no_browser_may_use_any_name(client, daemons):
    got = post(client, Host="other-name.example")
    assert got.status_code == 200
    assert daemons.ops() == [("etl-1", "create")]
