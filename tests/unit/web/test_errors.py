"""Errors in process (rqsys.web.answers): each RQError a daemon raises is one
HTTP status, answered as RQ's ``["fail", why]`` to a client and as a page of
the console to a browser; falcon's own errors in the same shapes; a full
disk named without its mount point; a bulk send that stops half-way."""

from __future__ import annotations

import json
import re

import pytest
import webfakes
from webfakes import MID, FakeDaemons, Served

from rqsys.errors import (
    BadRequest,
    ConfigError,
    Forbidden,
    InternalError,
    NoSpace,
    NotFound,
    NotSent,
    ProtocolError,
    QueueDown,
    StoreError,
    TooLarge,
    Unavailable,
)
from rqsys.store import room
from rqsys.wire.bulk import BATCH

HTML = {"Accept": "text/html,application/xhtml+xml"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
NDJSON = {"Content-Type": "application/x-ndjson"}


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> Served:
    return webfakes.served(tmp_path_factory.mktemp("web"))


@pytest.fixture
def daemons(web) -> FakeDaemons:
    return web.daemons.reset()


@pytest.fixture
def client(web, daemons):
    return web.client


def shown_error(page: str) -> str:
    """The error a console page says (its ``#error`` paragraph)."""
    found = re.search(r'<p class="error" id="error"[^>]*>(.*?)</p>', page, re.S)
    assert found, page
    return found.group(1)


@pytest.mark.parametrize(("exc", "status"), [
    (NotFound("boom"), 404), (BadRequest("boom"), 400), (ConfigError("boom"), 400),
    (TooLarge("boom"), 413), (Forbidden("boom"), 403), (QueueDown("boom"), 503),
    (Unavailable("boom"), 503), (NotSent("boom"), 503), (ProtocolError("boom"), 502),
    (NoSpace("boom"), 507), (StoreError("boom"), 500), (InternalError("boom"), 500)])
def test_each_daemon_error_is_its_status_with_rqs_fail_answer(client, daemons, exc, status):
    daemons.answers["state"] = exc
    got = client.simulate_get(f"/q/etl-1/{MID}/state.json")
    assert (got.status_code, got.json) == (status, ["fail", "boom"])
    assert got.headers["Content-Type"] == "application/json"


def test_a_browser_gets_the_error_as_a_page_with_the_status(client, daemons):
    daemons.answers["get"] = NotFound("no message 20260101.1200.00.001 in etl-1")
    got = client.simulate_get(f"/q/etl-1/{MID}", headers=HTML)
    assert got.status_code == 404
    assert got.headers["Content-Type"].startswith("text/html")
    assert shown_error(got.text) == "no message 20260101.1200.00.001 in etl-1"
    assert "go back to the form" not in got.text


def test_a_browsers_form_post_gets_a_page_offering_the_form_again(client, daemons):
    daemons.answers["delete"] = QueueDown("queue etl-1 is DOWN")
    got = client.simulate_post(f"/q/etl-1/{MID}", body="_method=delete", headers={**FORM, **HTML})
    assert got.status_code == 503
    assert shown_error(got.text) == "queue etl-1 is DOWN"
    assert "go back to the form" in got.text


@pytest.mark.parametrize("path", [f"/q/etl-1/{MID}.json", f"/q/etl-1/{MID}/state.json"])
def test_a_json_route_answers_json_even_to_a_browser(client, daemons, path):
    daemons.answers["get"] = daemons.answers["state"] = NotFound("gone")
    got = client.simulate_get(path, headers=HTML)
    assert (got.status_code, got.json) == (404, ["fail", "gone"])


def test_an_api_post_of_json_gets_json_whatever_it_accepts(client, daemons):
    daemons.answers["create"] = QueueDown("queue etl-1 is PAUSEd")
    got = client.simulate_post("/q/etl-1/new_message", body="{}",
                               headers={"Content-Type": "application/json", **HTML})
    assert (got.status_code, got.json) == (503, ["fail", "queue etl-1 is PAUSEd"])


@pytest.mark.parametrize(("method", "path", "status", "why"), [
    ("GET", "/nowhere", 404, "404 Not Found"),
    ("DELETE", "/q.json", 405, "405 Method Not Allowed"),
    ("PUT", f"/q/etl-1/{MID}", 405, "405 Method Not Allowed"),
])
def test_falcons_own_errors_are_in_rqs_shape(client, method, path, status, why):
    got = client.simulate_request(method, path)
    assert (got.status_code, got.json) == (status, ["fail", why])


def test_a_bug_is_a_500_that_says_nothing_of_it(client, daemons):
    daemons.answers["state"] = KeyError("/var/lib/rq/secret")
    got = client.simulate_get(f"/q/etl-1/{MID}/state.json")
    assert (got.status_code, got.json) == (500, ["fail", "500 Internal Server Error"])


def test_a_full_disk_is_507_naming_the_state_file_system_not_its_mount(client, daemons, web):
    mount = room.mount_point(str(web.layout.root))
    daemons.answers["create"] = NoSpace(f"no room for a message: {mount} has 12 inodes free")
    got = client.simulate_post("/q/etl-1/new_message", body="mesg={}", headers=FORM)
    assert (got.status_code, got.json) == (
        507, ["fail", "no room for a message: the state file system has 12 inodes free"])


# ---------------------------------------------------------------- new_messages
def test_a_bulk_send_refused_before_any_message_is_the_errors_status(client, daemons):
    daemons.answers["create_many"] = Unavailable("queue etl-1 is not running")
    got = client.simulate_post("/q/etl-1/new_messages", body='[{"param1": "a"}]',
                               headers={"Content-Type": "application/json"})
    assert (got.status_code, got.json) == (503, ["fail", "queue etl-1 is not running"])


def test_a_bulk_send_that_stops_after_a_batch_is_200_with_where_it_stopped(client, daemons):
    answers = iter([{"results": [{"msg_id": MID, "url": "u"}] * BATCH},
                    Unavailable("queue etl-1: timed out")])

    def create_many(**args):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    daemons.answers["create_many"] = create_many
    body = "\n".join(json.dumps({"param1": str(n)}) for n in range(BATCH + 5))
    got = client.simulate_post("/q/etl-1/new_messages", body=body, headers=NDJSON)
    assert got.status_code == 200
    assert (got.json["created"], got.json["failed"]) == (BATCH, 0)
    assert got.json["stopped"] == {"index": BATCH, "error": "queue etl-1: timed out",
                                   "kind": "Unavailable"}


def test_a_bad_ndjson_line_fails_alone(client, daemons):
    daemons.answers["create_many"] = lambda **args: {
        "results": [{"msg_id": MID, "url": "u"} for _ in args["msgs"]]}
    got = client.simulate_post("/q/etl-1/new_messages", headers=NDJSON,
                               body='{"param1": "a"}\n{oops\n{"param1": "c"}\n')
    assert (got.json["created"], got.json["failed"]) == (2, 1)
    assert got.json["results"][1] == {
        "error": "not a JSON message: Expecting property name enclosed in double quotes: "
                 "line 1 column 2 (char 1)", "kind": "BadRequest", "index": 1}
    assert [args["msgs"] for _q, _op, args in daemons.calls] == [
        [{"param1": "a"}, {"param1": "c"}]]


@pytest.mark.parametrize(("body", "ctype", "status", "why"), [
    ("[]", "application/json", 400, "new_messages takes a JSON array of messages (or NDJSON)"),
    ('{"param1": "a"}', "application/json", 400,
     "new_messages takes a JSON array of messages (or NDJSON)"),
    ("a=1", "application/x-www-form-urlencoded", 400,
     "unsupported content type 'application/x-www-form-urlencoded': send a JSON array "
     "(application/json) or NDJSON (application/x-ndjson)"),
])
def test_new_messages_refuses_what_is_no_list_of_messages(client, daemons, body, ctype, status,
                                                          why):
    got = client.simulate_post("/q/etl-1/new_messages", body=body,
                               headers={"Content-Type": ctype})
    assert (got.status_code, got.json) == (status, ["fail", why])
    assert daemons.calls == []
