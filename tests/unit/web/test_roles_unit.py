"""Roles over HTTP in process (rqsys.web.access): each route's decision for a
viewer, an operator of ``etl-*`` and an admin, on a fake of the daemons; a
refusal is a 403 naming the role before any daemon is asked, and what is
let through carries the user's identity to the daemon as its ``actor``."""

from __future__ import annotations

import json

import pytest
import webfakes
from webfakes import MID, FakeDaemons, Served, basic

from rqsys.web import search

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
EVERY_QUEUE = ("/timers", "/timers.json", "/search.json", "/search", "/metrics",
               "/audit.json", "/batches/b1")


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> Served:
    return webfakes.served(tmp_path_factory.mktemp("web"), basic_auth=webfakes.users_config())


@pytest.fixture
def daemons(web) -> FakeDaemons:
    return web.daemons.reset()


@pytest.fixture
def client(web, daemons):
    return web.client


def send(client, user: str, queue: str):
    return client.simulate_post(f"/q/{queue}/new_message", body='mesg={"param1":"x"}',
                                headers={**FORM, **basic(user)})


@pytest.fixture
def web_audit(web):
    """The web's audit records made since the test began."""
    path = web.layout.audit_dir / "web.jsonl"

    def records() -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines()] \
            if path.exists() else []

    start = len(records())
    return lambda: records()[start:]


# ---------------------------------------------------------------- viewer
def test_a_viewer_is_refused_a_new_message_by_the_role_before_any_daemon(client, daemons,
                                                                          web_audit):
    got = send(client, "vic", "billing")
    assert got.status_code == 403
    assert got.json == ["fail", "this needs the operator role on queue billing (you have: viewer)"]
    assert daemons.calls == []
    refused = web_audit()
    assert [(r["actor"], r["action"], r["queue"], r["result"]) for r in refused] == [
        ("vic", "POST /q/billing/new_message", "billing", "refused")]


@pytest.mark.parametrize(("path", "form", "need"), [
    (f"/q/billing/{MID}", "_method=delete", "operator"),
    (f"/q/billing/{MID}/run_now", "", "operator"),
    ("/q/billing/bulk", "action=retry", "operator"),
    ("/q/billing/adminoper", "pause=1", "admin"),
    ("/new_queue", "name=x", "admin"),
])
def test_a_viewer_is_refused_every_change_naming_the_role_it_needs(client, daemons, path,
                                                                    form, need):
    got = client.simulate_post(path, body=form, headers={**FORM, **basic("vic")})
    assert got.status_code == 403
    where = " on queue billing" if "/q/" in path else ""
    assert got.json == ["fail", f"this needs the {need} role{where} (you have: viewer)"]
    assert daemons.calls == []


@pytest.mark.parametrize(("path", "op"), [
    ("/q.json", None), ("/q/billing.json", "counts"), (f"/q/billing/{MID}/state.json", "state"),
    ("/q/billing/messages.json", "list"), ("/q/billing/search.json", "search"),
    ("/q/billing/done.json", "list"), ("/timers.json", None)])
def test_a_viewer_reads_every_queue(client, daemons, path, op):
    got = client.simulate_get(path, headers=basic("vic"))
    assert got.status_code == 200, got.text
    assert [o for _q, o in daemons.ops()] == ([op] if op else [])


def test_a_viewer_is_not_given_the_admin_audit_trail(client):
    got = client.simulate_get("/audit.json", headers=basic("vic"))
    assert got.status_code == 403
    assert got.json == ["fail", "this needs the admin role (you have: viewer)"]


# ---------------------------------------------------------------- operator of etl-*
def test_an_operator_sends_to_its_queues_only(client, daemons):
    assert send(client, "olga", "etl-1").status_code == 200
    got = send(client, "olga", "billing")
    assert got.status_code == 403
    assert got.json == ["fail",
                        "this needs the operator role on queue billing (you have: operator)"]
    assert daemons.ops() == [("etl-1", "create")]


def test_an_operator_of_some_queues_neither_sees_nor_reads_the_others(client, daemons):
    assert client.simulate_get("/q.json", headers=basic("olga")).json == ["etl-1", "etl-2"]
    assert client.simulate_get("/q.txt", headers=basic("olga")).text == \
        "q/etl-1.txt\nq/etl-2.txt\n"
    got = client.simulate_get("/q/billing/messages.json", headers=basic("olga"))
    assert got.status_code == 403
    assert got.json == ["fail", "this needs the viewer role on queue billing (you have: operator)"]
    assert daemons.calls == []


@pytest.mark.parametrize("path", EVERY_QUEUE)
def test_an_operator_of_some_queues_is_refused_the_pages_of_every_queue(client, daemons, path):
    got = client.simulate_get(path, headers=basic("olga"))
    assert got.status_code == 403
    assert got.json == ["fail", "this shows every queue: it needs a user of all queues "
                                "(yours: etl-*)"]
    assert daemons.calls == []


def test_an_operator_may_not_change_a_queues_admin_state(client, daemons):
    got = client.simulate_post("/q/etl-1/adminoper", body="pause=1",
                               headers={**FORM, **basic("olga")})
    assert got.status_code == 403
    assert got.json == ["fail", "this needs the admin role on queue etl-1 (you have: operator)"]
    assert daemons.calls == []


# ---------------------------------------------------------------- the actor
@pytest.mark.parametrize(("user", "actor"), [
    ("olga", {"user": "olga", "address": "192.0.2.7", "role": "operator",
              "queues": ["etl-*"]}),
    ("ann", {"user": "ann", "address": "192.0.2.7", "role": "admin"}),
    ("old", {"user": "old", "address": "192.0.2.7", "role": "admin"}),
])
def test_the_daemon_is_told_who_acts_with_the_users_role_and_queues(client, daemons, user,
                                                                    actor):
    got = client.simulate_post(f"/q/etl-1/{MID}", body="_method=delete",
                               headers={**FORM, **basic(user)}, remote_addr="192.0.2.7")
    assert got.json == ["ok", "delete: done"]
    assert daemons.calls == [("etl-1", "delete", {"actor": actor, "msg_id": MID})]


def test_without_basic_auth_whoever_reaches_the_web_acts_as_an_admin(layout, daemons):
    webfakes.make_layout(layout)
    got = webfakes.client(layout, daemons).simulate_post(
        "/q/billing/adminoper", body="oper=pause", headers=FORM)
    assert got.json == ["ok", "PAUSE"]
    assert daemons.calls == [("billing", "adminoper", {
        "actor": {"user": "", "address": "127.0.0.1", "role": "admin"}, "oper": "pause"})]


def test_a_wrong_password_is_401_even_for_a_browser(client, daemons):
    got = client.simulate_get("/q/etl-1", headers={**basic("olga", "wrong"),
                                                   "Accept": "text/html"})
    assert got.status_code == 401
    assert got.json == ["fail", "authentication required: wrong user name or password"]
    assert got.headers["WWW-Authenticate"] == 'Basic realm="rq"'


# ---------------------------------------------------------------- bulk move's dest
class RecordingClient:
    """Stands in for the QueueClient a bulk action opens (its long timeout)."""

    calls: list[tuple[str, str, dict]] = []

    def __init__(self, layout, queue: str, timeout: float = 30.0) -> None:
        self.queue = queue

    def __enter__(self) -> RecordingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def call(self, op: str, **args):
        self.calls.append((self.queue, op, args))
        return {"action": args["action"], "matched": 3, "count": 2, "passed_over": 1}


@pytest.fixture
def bulk_client(monkeypatch):
    RecordingClient.calls = []
    monkeypatch.setattr(search, "QueueClient", RecordingClient)
    return RecordingClient


def test_a_bulk_move_to_a_queue_the_operator_may_not_change_is_refused_first(
        client, daemons, bulk_client, web_audit):
    got = client.simulate_post("/q/etl-1/bulk", body=f"action=move&dest=billing&id={MID}",
                               headers={**FORM, **basic("olga")})
    assert got.status_code == 403
    assert got.json == ["fail",
                        "this needs the operator role on queue billing (you have: operator)"]
    assert bulk_client.calls == [] and daemons.calls == []
    assert [(r["action"], r["queue"], r["error"]) for r in web_audit()] == [
        ("POST /q/etl-1/bulk", "billing", "Forbidden: this needs the operator role on queue "
                                          "billing (you have: operator)")]


def test_a_bulk_move_between_the_operators_queues_goes_with_its_actor(client, bulk_client):
    got = client.simulate_post("/q/etl-1/bulk", body=f"action=move&dest=etl-2&id={MID}",
                               headers={**FORM, **basic("olga")}, remote_addr="192.0.2.7")
    assert got.json == ["ok", {"action": "move", "matched": 3, "count": 2, "passed_over": 1}]
    assert bulk_client.calls == [("etl-1", "bulk", {
        "action": "move", "dest": "etl-2", "ids": [MID],
        "actor": {"user": "olga", "address": "192.0.2.7", "role": "operator",
                  "queues": ["etl-*"]}})]


# ---------------------------------------------------------------- a queue named exactly
@pytest.mark.parametrize("path", ["/q/billing.json", "/q/billing.txt"])
def test_a_viewer_of_one_named_queue_reads_its_summary(layout, daemons, monkeypatch, path):
    settings = webfakes.users_config()
    settings["users"]["bea"] = settings["users"]["vic"] | {"queues": ["billing"]}
    webfakes.make_layout(layout, basic_auth=settings)
    got = webfakes.client(layout, daemons).simulate_get(path, headers=basic("bea", "pw-vic"))
    assert got.status_code == 200, got.text
