"""The audit trail (issue 33 item 2) over real HTTP, the real socket and the
real `rq` CLI: who changed what, from where, with what result; read back
through /audit.json (admins of all queues only) and `rq audit`."""

from __future__ import annotations

import base64
import json
import os
import pwd
import signal

import pytest
from conftest import wait_for
from daemon_util import rq
from web_support import web_server  # noqa: F401

from rqsys.observe import auditread
from rqsys.web import auth

USERS = {"ann": "admin", "vic": "viewer"}


def _auth(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw-{user}".encode()).decode()}


def _records(layout, **flt) -> list[dict]:
    return auditread.records(layout.audit_dir, auditread.Filter(**flt))


@pytest.fixture
def server(layout, make_queue, daemon, web_server):  # noqa: F811
    make_queue("billing", "exit 1")
    proc = daemon("billing")
    users = {u: {"password": auth.hash_password(f"pw-{u}"), "role": r} for u, r in USERS.items()}
    web = web_server(basic_auth={"realm": "rq", "users": users})
    web.daemon = proc
    return web


def _send(server) -> str:
    status, answer = server.form("/q/billing/new_message", {"mesg": '{"param1":"x"}'},
                                 headers=_auth("ann"))
    assert status == 200, answer
    return str(answer[1]).rstrip("/").rsplit("/", 1)[1]


def _in_err(server, msg_id: str) -> None:
    wait_for(lambda: server.daemon.call("state", msg_id=msg_id)["state"] == "err",
             what=f"{msg_id} in err")


def _audit_json(server, query: str = "", user: str = "ann") -> tuple[int, dict]:
    status, _h, data = server.request("GET", "/audit.json" + query, headers=_auth(user))
    return status, json.loads(data)


def test_what_ann_does_over_http_is_recorded_with_her_name_and_address(server, layout):
    # Given: a message of ann's that failed
    one = _send(server)
    _in_err(server, one)
    # When: ann retries it, deletes it, bulk-deletes two more, and pauses the queue
    assert server.form(f"/q/billing/{one}", {"_method": "retry"}, headers=_auth("ann"))[0] == 200
    _in_err(server, one)
    assert server.form(f"/q/billing/{one}", {"_method": "delete"},
                       headers=_auth("ann"))[0] == 200
    two, three = _send(server), _send(server)
    _in_err(server, two)
    _in_err(server, three)
    wait_for(lambda: server.daemon.call("search", state="err")["total"] == 2,
             what="both in the search index")
    status, answer = server.form("/q/billing/bulk", {"action": "delete", "state": "err"},
                                 headers=_auth("ann"))
    assert status == 200 and answer[1]["count"] == 2, answer
    assert server.form("/q/billing/adminoper", {"pause": "1"}, headers=_auth("ann"))[0] == 200
    # Then: each is in /audit.json, newest first, as ann from 127.0.0.1
    status, got = _audit_json(server)
    assert status == 200, got
    recs = got["records"]
    assert [r["action"] for r in recs] == ["pause", "bulk_delete", "create", "create", "delete",
                                           "retry", "create"]
    assert all(r["actor"] == "ann" and r["from"] == "127.0.0.1" and r["result"] == "ok"
               and r["queue"] == "billing" for r in recs)
    assert recs[1]["count"] == 2 and recs[1]["filter"] == {"state": "err"}
    assert recs[4]["msg_ids"] == [one] and recs[5]["msg_ids"] == [one]
    assert recs[6]["msg_ids"] == [one]
    # filtered: by action, actor, queue and time
    assert [r["msg_ids"] for r in _audit_json(server, "?action=delete")[1]["records"]] == [[one]]
    assert _audit_json(server, "?actor=vic")[1]["total"] == 0
    assert _audit_json(server, "?queue=billing&limit=2&offset=1")[1]["records"] == recs[1:3]
    since = recs[2]["time"]
    assert len(_audit_json(server, f"?since={since}")[1]["records"]) == 3
    assert _audit_json(server, "?until=1970-01-02T00:00:00")[1]["total"] == 0
    # and shown on the /audit page
    page = server.request("GET", "/audit?action=bulk_delete", headers=_auth("ann"))[2].decode()
    assert "bulk_delete" in page and "state=err" in page and "(2 messages)" in page


def test_a_failed_action_records_its_error_and_a_refusal_is_recorded(server, layout):
    status, answer = server.form("/q/billing/20240101.0000.00.001", {"_method": "delete"},
                                 headers=_auth("ann"))
    assert status == 404, answer
    failed = _records(layout, action="delete")
    assert failed[0]["result"] == "failed" and failed[0]["error"].startswith("NotFound: ")
    # a viewer's change is refused by the web itself: recorded there
    assert server.form("/q/billing/adminoper", {"pause": "1"}, headers=_auth("vic"))[0] == 403
    refused = _records(layout, actor="vic")
    assert refused[0]["result"] == "refused" and "needs the admin role" in refused[0]["error"]
    assert refused[0]["action"] == "POST /q/billing/adminoper"


def test_only_an_admin_of_all_queues_reads_it_and_bad_inputs_name_their_field(server):
    assert _audit_json(server, user="vic")[0] == 403
    assert server.request("GET", "/audit", headers=_auth("vic"))[0] == 403
    for query, field in (("?since=yesterday", "since"), ("?until=2024-13-45", "until"),
                         ("?limit=-1", "limit"), ("?offset=x", "offset"),
                         ("?limit=100000", "limit")):
        status, got = _audit_json(server, query)
        assert status == 400 and field in json.dumps(got), (query, got)


def test_a_socket_client_is_recorded_as_its_user_and_process(layout, make_queue, daemon):
    make_queue("q", "exit 0")
    daemon("q")
    url = rq(layout, "sendmesg", "--dest", "q", "--param1", "x").split()[-1]
    msg_id = url.rstrip("/").rsplit("/", 1)[1]
    rq(layout, "delete", "--msg_id", url.replace(msg_id, "20240101.0000.00.001"), code=1)
    me = pwd.getpwuid(os.getuid()).pw_name
    recs = _records(layout, queue="q")
    assert [(r["action"], r["result"]) for r in recs] == [("delete", "failed"),
                                                          ("create", "ok")]
    assert all(r["actor"] == me and r["from"].startswith("pid ") for r in recs)
    assert recs[1]["msg_ids"] == [msg_id]
    # a socket client naming an actor is an admin here (the test runs as the daemon's
    # user), so it is believed; `rq audit` prints and filters them
    shown = rq(layout, "audit", "--queue", "q", "--action", "delete")
    assert shown.count("\n") == 0 and "delete q 20240101.0000.00.001" in shown
    assert "failed: NotFound" in shown
    lines = rq(layout, "audit", "--json", "--actor", me).splitlines()
    assert [json.loads(line)["action"] for line in lines] == ["delete", "create"]


def test_a_record_survives_a_kill_right_after_the_answer(layout, make_queue, daemon):
    make_queue("q", "exit 1")
    proc = daemon("q")
    msg_id = proc.call("create", msg={"param1": "x"})["msg_id"]
    wait_for(lambda: proc.call("state", msg_id=msg_id)["state"] == "err", what="err")
    assert proc.call("delete", msg_id=msg_id)["ok"]
    proc.kill(signal.SIGKILL)
    proc.proc.wait(10)
    recs = _records(layout, action="delete")
    assert recs and recs[0]["msg_ids"] == [msg_id] and recs[0]["result"] == "ok"


def test_the_file_is_rotated_at_its_size(layout, make_queue, daemon):
    make_queue("q", "exit 0")
    proc = daemon("q", env={"RQ_AUDIT_MAX_BYTES": "600"})
    ids = [proc.call("create", msg={"param1": str(n)})["msg_id"] for n in range(12)]
    wait_for(lambda: (layout.audit_dir / "q.jsonl.1").exists(), what="a rotation")
    proc.stop()
    names = sorted(n for n in os.listdir(layout.audit_dir) if n != "q.reserve")  # full disks
    assert "q.jsonl" in names and "q.jsonl.1" in names
    assert all(n in ("q.jsonl", *(f"q.jsonl.{k}" for k in range(1, 6))) for n in names)
    kept = [r["msg_ids"][0] for r in _records(layout, queue="q")]
    assert kept == sorted(kept, reverse=True) and set(kept) <= set(ids)
    assert kept[0] == ids[-1]  # the newest is never lost to a rotation
