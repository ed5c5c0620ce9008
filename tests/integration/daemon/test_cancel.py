"""Cancel through a real daemon, the rq command and real HTTP: a queued and a
running message end in err with a record of who cancelled them, can be
retried, and their dependents see them as failed."""

from __future__ import annotations

import base64
import json
import time

import pytest
from conftest import wait_for
from daemon_util import pid_alive, rq, send, settle
from web_support import web_server  # noqa: F401

from rqsys.errors import BadRequest

WAITS = """
echo $$ > "$RQ_MSG_DIR/pid"
trap 'echo "got TERM" >> "$RQ_MSG_DIR/../../../terms"; exit 3' TERM
[ -e "$RQ_MSG_DIR/../../../go" ] && { echo "done fine" >&3; exit 0; }
while :; do sleep 0.05; done
"""


def test_rq_cancel_a_running_message_stops_it_and_keeps_a_record(layout, make_queue, daemon):
    # Given a running message whose script waits
    make_queue("q", WAITS)
    proc = daemon("q")
    msg_id = send(proc)
    wait_for(lambda: proc.call("status", msg_id=msg_id)["state"] == "run")
    pid_file = layout.queue_dir("q") / "run" / msg_id / "job" / "pid"
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip()))
    # When `rq cancel` asks
    assert rq(layout, "cancel", "--msg_id", msg_id) == "ok cancelled"
    # Then its script got TERM and the message is in err, saying who, marked cancelled
    got = proc.call("get", msg_id=msg_id)
    assert got["state"] == "err" and got["status"].startswith("cancelled by socket pid ")
    assert got["cancelled"] is True
    assert "got TERM" in (layout.queue_dir("q") / "terms").read_text()
    assert not pid_alive(pid)
    assert [e["ev"] for e in got["timeline"]][-3:] == ["cancel", "exit", "err"]
    # and a cancel again is refused: it is not queued or running
    with pytest.raises(BadRequest, match="only a queued or running message can be cancelled"):
        proc.call("cancel", msg_id=msg_id)
    # and it can be retried like any err, and then is not marked cancelled
    (layout.queue_dir("q") / "go").write_text("")
    proc.call("retry", msg_id=msg_id)
    assert settle(proc, msg_id)["state"] == "done"
    assert proc.call("get", msg_id=msg_id)["cancelled"] is False


def test_a_script_that_ignores_term_is_killed_after_stop_grace(layout, make_queue, daemon):
    make_queue("q", "trap '' TERM; echo $$ > \"$RQ_MSG_DIR/pid\"; while :; do sleep 0.05; done",
               stop_grace=1)
    proc = daemon("q")
    msg_id = send(proc)
    # its pid file (in RQ_MSG_DIR, its job/) says its trap is set (a TERM before would end it)
    wait_for(lambda: any(layout.queue_dir("q").glob(f"run/**/{msg_id}/job/pid")))
    asked = time.monotonic()
    assert proc.call("cancel", msg_id=msg_id, by="alice")["stopping"] is True
    reply = settle(proc, msg_id)
    assert 0.9 < time.monotonic() - asked < 8
    assert reply == {"ok": True, "state": "err", "status": "cancelled by alice"}


def test_cancel_a_queued_message_over_http_fails_its_dependents(layout, make_queue, daemon,
                                                                web_server):  # noqa: F811
    # Given a paused queue with a message and one that waits for it
    make_queue("q", WAITS)
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    first = send(proc)
    waiting = send(proc, after=[first])
    server = web_server(basic_auth={"realm": "rq", "users": {"carol": "pw"}})
    auth = {"Authorization": "Basic " + base64.b64encode(b"carol:pw").decode()}
    # When carol cancels the first through the console's form
    page = server.request("GET", f"/q/q/{first}", headers=auth)[2].decode()
    assert 'name="_method" value="cancel"' in page
    status, _body = server.form(f"/q/q/{first}", {"_method": "cancel"}, headers=auth)
    assert status == 200
    # Then it is in err, cancelled by carol, and its dependent failed with it
    code, _h, data = server.request("GET", f"/q/q/{first}.json", headers=auth)
    shown = json.loads(data)
    assert code == 200 and shown["state"] == "err" and shown["cancelled"] is True
    assert shown["status"] == "err - cancelled by carol"
    dependent = settle(proc, waiting)
    assert dependent["state"] == "err" and first in dependent["status"]
    # and a bad id or a message in done is refused with a clear error, nothing changed
    code, _b = server.form("/q/q/20200101.0000.00.000.0", {"_method": "cancel"}, headers=auth)
    assert code == 404
    assert proc.call("counts")["counts"]["err"] == 2
