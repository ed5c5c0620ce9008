"""Cross-queue routes over real HTTP: an operator of ``etl-*`` only tries to
put work into queue ``billing`` by every route that names another queue than
its own: a bulk move (chosen ids, or a search), a message or a bulk of them
whose ``dest`` is billing, a batch member or callback, and (an operator of the
relay queue too) a relayed message whose dest is this host's billing URL.
Each is refused (403 naming billing) and billing stays empty; an admin may
move, and billing's own audit trail names the admin, not the web's user."""

from __future__ import annotations

import base64
import json

import pytest
from conftest import wait_for
from web_support import web_server  # noqa: F401

from rqsys.web import auth

USERS = {"olga": ("operator", ["etl-*"]), "rita": ("operator", ["etl-*", "relay"]),
         "ann": ("admin", None), "vic": ("viewer", None)}
REFUSED = "this needs the operator role on queue billing (you have: operator)"
JSON = {"Content-Type": "application/json"}


def _auth(user: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:pw-{user}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


class World:
    def __init__(self, layout, procs, server) -> None:
        self.layout, self.procs, self.server = layout, procs, server

    def failed(self) -> str:
        """A new etl-1 message, once it has failed (in err)."""
        msg_id = str(self.procs["etl-1"].call("create", msg={"param1": "x"})["msg_id"])
        wait_for(lambda: self.procs["etl-1"].call("status", msg_id=msg_id)["state"] == "err",
                 15, f"{msg_id} in err")
        return msg_id

    def state(self, msg_id: str) -> str:
        return str(self.procs["etl-1"].call("get", msg_id=msg_id)["state"])

    def billing_total(self) -> int:
        return sum(self.procs["billing"].call("counts")["counts"].values())

    def audit(self, name: str) -> list[dict]:
        path = self.layout.audit_dir / f"{name}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] \
            if path.exists() else []

    def post_json(self, path: str, data, user: str) -> tuple[int, bytes]:
        code, _h, body = self.server.request("POST", path, json.dumps(data),
                                             {**JSON, **_auth(user)})
        return code, body


@pytest.fixture
def w(layout, make_queue, daemon, web_server):  # noqa: F811
    make_queue("etl-1", "exit 1")
    make_queue("billing", "echo done >&3")
    make_queue("relay", "exit 1")  # a stand-in script: what counts is whether it is taken
    users = {user: {"password": auth.hash_password(f"pw-{user}"), "role": role,
                    **({"queues": queues} if queues else {})}
             for user, (role, queues) in USERS.items()}
    # the web first: its config.json (host, port) is what tells a daemon its own URLs
    server = web_server(basic_auth={"realm": "rq", "users": users})
    procs = {name: daemon(name) for name in ("etl-1", "billing", "relay")}
    return World(layout, procs, server)


def test_bulk_move_of_chosen_ids_into_another_queue_is_refused(w):
    msg_id = w.failed()
    status, answer = w.server.form("/q/etl-1/bulk", {
        "action": "move", "state": "err", "id": msg_id, "dest": "billing"},
        headers=_auth("olga"))
    assert status == 403, answer
    assert answer == ["fail", REFUSED]
    assert w.state(msg_id) == "err"
    code, _h, data = w.server.request("GET", f"/q/etl-1/{msg_id}.json", headers=_auth("olga"))
    assert code == 200 and json.loads(data)["state"] == "err"
    assert w.billing_total() == 0
    refused = [r for r in w.audit("web") if r.get("result") == "refused"]
    assert [(r["actor"], r["action"]) for r in refused] == [("olga", "POST /q/etl-1/bulk")]
    assert "billing" in refused[0].get("error", "")


def test_bulk_move_of_a_search_into_another_queue_is_refused(w):
    msg_id = w.failed()
    wait_for(lambda: w.server.request("GET", "/q/etl-1/search.json?state=err",
                                      headers=_auth("ann"))[2].count(msg_id.encode()),
             15, "the search index to hold the err message")  # else a move would find none
    status, answer = w.server.form("/q/etl-1/bulk", {
        "action": "move", "state": "err", "dest": "billing"}, headers=_auth("olga"))
    assert status == 403 and answer == ["fail", REFUSED], answer
    assert w.state(msg_id) == "err" and w.billing_total() == 0


def test_messages_and_batches_naming_another_queue_are_refused(w):
    mesg = json.dumps({"dest": "billing", "param1": "x"})
    status, answer = w.server.form("/q/etl-1/new_message", {"mesg": mesg},
                                   headers=_auth("olga"))
    assert not 200 <= status < 300 and answer[0] == "fail", (status, answer)
    code, data = w.post_json("/q/etl-1/new_messages", [{"dest": "billing"}], "olga")
    if code == 200:  # a per-message failure, the others (none here) created
        got = json.loads(data)
        assert got["created"] == 0 and "error" in got["results"][0], got
    else:
        assert code == 403 and b"billing" in data, (code, data)
    member = {"messages": [{"dest": "billing"}]}
    callback = {"messages": [{"dest": "etl-1"}], "on_err": {"dest": "billing"}}
    for batch in (member, callback):
        code, data = w.post_json("/batches", batch, "olga")
        assert code == 403 and REFUSED.encode() in data, (batch, code, data)
    assert w.billing_total() == 0
    assert not w.layout.batches.exists() or not any(w.layout.batches.iterdir())


def test_a_relayed_message_to_this_hosts_billing_url_is_refused(w):
    dest = w.server.base + "/q/billing"
    mesg = json.dumps({"dest": dest, "force_remote": True, "param1": "x"})
    status, answer = w.server.form("/q/relay/new_message", {"mesg": mesg},
                                   headers=_auth("rita"))
    assert status == 403 and answer == ["fail", REFUSED], (status, answer)
    assert sum(w.procs["relay"].call("counts")["counts"].values()) == 0
    assert w.billing_total() == 0


def test_a_forced_remote_plain_name_through_the_relay_is_refused(w):
    """Not in the brief's list: ``force_remote`` with the plain name billing is
    accepted by the relay queue (daemon.context.check_dest) and relayed to this
    host's billing URL (scripts/relay.py): the same route, another spelling."""
    mesg = json.dumps({"dest": "billing", "force_remote": True, "param1": "x"})
    status, answer = w.server.form("/q/relay/new_message", {"mesg": mesg},
                                   headers=_auth("rita"))
    assert status == 403 and answer == ["fail", REFUSED], (status, answer)
    assert sum(w.procs["relay"].call("counts")["counts"].values()) == 0


def test_an_admin_moves_and_billing_names_the_admin(w):
    msg_id = w.failed()
    status, answer = w.server.form("/q/etl-1/bulk", {
        "action": "move", "state": "err", "id": msg_id, "dest": "billing"},
        headers=_auth("ann"))
    assert status == 200, answer
    assert answer == ["ok", {"action": "move", "matched": 1, "count": 1, "passed_over": 0}]
    assert w.billing_total() == 1
    assert w.procs["etl-1"].call("counts")["counts"].get("err", 0) == 0
    made = [r for r in w.audit("billing") if r.get("action") == "create_many"]
    assert len(made) == 1 and made[0]["result"] == "ok", made
    assert made[0]["actor"] == "ann", made[0]


def test_a_viewer_may_not_retry_a_failure_group(w):
    msg_id = w.failed()
    code, _h, data = w.server.request("GET", "/q/etl-1/groups.json", headers=_auth("vic"))
    assert code == 200, data
    (group,) = json.loads(data)
    assert group["count"] == 1
    status, answer = w.server.form(f"/q/etl-1/groups/{group['key']}", {"_method": "retry"},
                                   headers=_auth("vic"))
    assert status == 403 and answer == [
        "fail", "this needs the operator role on queue etl-1 (you have: viewer)"], answer
    assert w.state(msg_id) == "err"
    assert [r["actor"] for r in w.audit("web") if r.get("result") == "refused"] == ["vic"]
