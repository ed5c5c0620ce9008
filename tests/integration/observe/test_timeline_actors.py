"""Who acted on a message, on its timeline (issue 33 part 2), through real
daemons over their real sockets, the real web over HTTP and the real `rq`
CLI: a retry (one, a bulk one) names the web's user and address, or the
socket client's user and process; a move names who moved it on the copy's
``created`` line; a delete names who in the daemon's ``deleted`` entry (the
message's timeline goes with it); a claim to be someone else from a peer
that is no admin is not believed."""

from __future__ import annotations

import base64
import grp
import json
import os
import pwd
import re
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from conftest import wait_for
from daemon_util import rq, store_of
from web_support import web_server  # noqa: F401

from rqsys.observe import timeline
from rqsys.web import auth

ANN = {"Authorization": "Basic " + base64.b64encode(b"ann:pw-ann").decode()}
FORM = {"Content-Type": "application/x-www-form-urlencoded", **ANN}
BY_ANN = "ann (127.0.0.1)"
NOBODY = 65534
CLIENT = """if 1:
    import json, socket, sys
    s = socket.socket(socket.AF_UNIX)
    s.connect("q.sock")
    f = s.makefile("rwb")
    f.write(sys.argv[1].encode() + b"\\n"); f.flush()
    print(f.readline().decode().strip())
"""


@pytest.fixture
def server(layout, make_queue, daemon, web_server):  # noqa: F811
    make_queue("billing", "exit 1")
    make_queue("other", "sleep 30")
    proc = daemon("billing")
    daemon("other")
    users = {"ann": {"password": auth.hash_password("pw-ann"), "role": "admin"}}
    web = web_server(basic_auth={"realm": "rq", "users": users})
    web.daemon = proc
    return web


def _failed(server, n: int = 1) -> list[str]:
    """``n`` messages ann sent, each failed (in err)."""
    ids = []
    for _ in range(n):
        status, answer = server.form("/q/billing/new_message", {"mesg": "{}"}, headers=ANN)
        assert status == 200, answer
        ids.append(str(answer[1]).rstrip("/").rsplit("/", 1)[1])
    for msg_id in ids:
        _in_err(server.daemon, msg_id)
    return ids


def _in_err(proc, msg_id: str) -> None:
    wait_for(lambda: proc.call("state", msg_id=msg_id)["state"] == "err", what=f"{msg_id} err")


def _retried_by(events: list[dict]) -> list[str]:
    return [e.get("by", "") for e in events if e["ev"] == "retried"]


def test_ann_retrying_one_over_http_is_on_its_timeline_json_and_page(server):
    (msg_id,) = _failed(server)
    assert server.form(f"/q/billing/{msg_id}", {"_method": "retry"}, headers=ANN)[0] == 200
    _in_err(server.daemon, msg_id)  # it ran again and failed again
    status, _h, data = server.request("GET", f"/q/billing/{msg_id}.json", headers=ANN)
    shown = json.loads(data)
    assert status == 200 and _retried_by(shown["_timeline"]) == [BY_ANN], shown["_timeline"]
    page = server.request("GET", f"/q/billing/{msg_id}", headers=ANN)[2].decode()
    assert re.search(r'retried by <span class="mono actor">ann \(127\.0\.0\.1\)</span>', page)


def test_a_bulk_retry_names_ann_on_each_timeline(server, layout):
    ids = _failed(server, 3)
    wait_for(lambda: server.daemon.call("search", state="err")["total"] == 3,
             what="all three in the search index")
    status, answer = server.form("/q/billing/bulk", {"action": "retry", "state": "err"},
                                 headers=ANN)
    assert status == 200 and answer[1]["count"] == 3, answer
    store = store_of(layout, "billing")
    for msg_id in ids:
        _in_err(server.daemon, msg_id)
        assert _retried_by(timeline.read(store.msg_dir("err", msg_id))) == [BY_ANN]


def test_a_move_names_ann_on_the_copy_and_a_delete_in_the_deleted_entry(server, layout):
    moved, deleted = _failed(server, 2)
    body = urlencode([("action", "move"), ("dest", "other"), ("state", "err"), ("id", moved)])
    status, _h, data = server.request("POST", "/q/billing/bulk", body, FORM)
    assert status == 200 and json.loads(data)[1]["count"] == 1, data
    other = store_of(layout, "other")
    (copy,) = [i for s in ("que", "run") for i in other.ids(s)]
    created = timeline.read(other.msg_dir(other.find(copy), copy))[0]
    assert created["ev"] == "created" and created["by"] == f"moved from billing by {BY_ANN}"
    # a delete: the message and its timeline are gone; the daemon's entry says who
    assert server.form(f"/q/billing/{deleted}", {"_method": "delete"}, headers=ANN)[0] == 200
    wait_for(lambda: f"{deleted}: deleted: deleted from err by {BY_ANN}"
             in server.daemon.stderr_text(), what="the deleted entry")


def test_a_socket_client_is_named_by_its_user_and_process(layout, make_queue, daemon):
    make_queue("q", "exit 1")
    proc = daemon("q")
    url = rq(layout, "sendmesg", "--dest", "q").split()[-1]
    msg_id = url.rstrip("/").rsplit("/", 1)[1]
    _in_err(proc, msg_id)
    assert rq(layout, "retry", url) == f"retried {msg_id}"
    _in_err(proc, msg_id)
    (by,) = _retried_by(timeline.read(store_of(layout, "q").msg_dir("err", msg_id)))
    me = pwd.getpwuid(os.getuid()).pw_name
    program = os.path.realpath(sys.executable)  # its executable, as the kernel names it
    assert re.fullmatch(rf"{re.escape(me)} \({re.escape(program)}, pid [0-9]+\)", by), by


@pytest.fixture
def rq_group() -> Iterator[int]:
    """Group rq (an operator's), made for the test when the host lacks it."""
    made = False
    try:
        grp.getgrnam("rq")
    except KeyError:
        subprocess.run(["groupadd", "--system", "rq"], check=True)
        made = True
    try:
        yield grp.getgrnam("rq").gr_gid
    finally:
        if made:
            subprocess.run(["groupdel", "rq"], check=False)


def test_a_claim_from_a_peer_that_is_no_admin_is_not_believed(layout, make_queue, daemon,
                                                              rq_group):
    make_queue("q", "exit 1")
    proc = daemon("q")
    msg_id = proc.call("create", msg={})["msg_id"]
    _in_err(proc, msg_id)
    claim = {"op": "retry", "msg_id": msg_id, "actor": {"user": "mallory", "address": "6.6.6.6"}}
    assert _as_nobody_in(layout, rq_group, claim) == {"ok": True}
    _in_err(proc, msg_id)
    (by,) = _retried_by(timeline.read(store_of(layout, "q").msg_dir("err", msg_id)))
    assert by.startswith(f"{pwd.getpwuid(NOBODY).pw_name} (") and "mallory" not in by, by


def _as_nobody_in(layout, gid: int, request: dict) -> dict:
    """The answer to ``request`` sent by a process of user nobody in group
    ``gid`` (rq: an operator, who may retry)."""
    os.chmod(layout.socket_path("q"), 0o666)  # rq@.socket's SocketMode
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={gid}",
            "/usr/bin/python3", "-c", CLIENT, json.dumps(request)]
    done = subprocess.run(argv, cwd=layout.socket_dir, capture_output=True, text=True,
                          timeout=30, check=True)
    return json.loads(done.stdout)


def test_a_creator_claimed_by_a_peer_that_is_no_admin_is_named_by_the_kernel(
        layout, make_queue, daemon, rq_group):
    # Given a queue, and an operator's process (user nobody in group rq)
    make_queue("q", "sleep 30")
    proc = daemon("q")
    # When it creates a message saying a timer made it, then cancels it as "root"
    made = _as_nobody_in(layout, rq_group, {"op": "create", "msg": {}, "by": "timer nightly"})
    msg_id = made["msg_id"]
    wait_for(lambda: proc.call("status", msg_id=msg_id)["state"] == "run", 10, "it runs")
    assert _as_nobody_in(layout, rq_group, {"op": "cancel", "msg_id": msg_id,
                                            "by": "root"})["ok"] is True
    # Then its timeline names the process the kernel names, beside what it said
    got = wait_for(lambda: (s := proc.call("status", msg_id=msg_id))["state"] == "err" and s,
                   20, "cancelled")
    peer = f"socket pid \\d+ uid {NOBODY}"
    assert re.fullmatch(rf"cancelled by {peer} \(says: root\)", got["status"]), got
    (created,) = [e for e in timeline.read(store_of(layout, "q").msg_dir("err", msg_id))
                  if e["ev"] == "created"]
    assert re.fullmatch(rf"{peer} \(says: timer nightly\)", created["by"]), created
