"""Failure groups: err messages grouped by normalised reason, kept per event
by a real daemon, and retried or deleted a whole group at a time (socket,
``rq groups``/``rq retry`` and HTTP)."""

from __future__ import annotations

import json
import subprocess
import sys

import falcon.testing
import pytest
from daemon_util import send, settle, store_of

from rqsys import config, timeline
from rqsys.errors import BadRequest, NotFound
from rqsys.failures import normalise
from rqsys.web.app import create_app

RQ = [sys.executable, "-c", "import sys; from rqsys.cli import rq_main; sys.exit(rq_main())"]
SCRIPT = """
[ -e "$RQ_MSG_DIR/../../../fixed" ] && { echo "done fixed" >&3; exit 0; }
case "$RQ_PARAM1" in
  db) echo "err connect to db01:$RQ_PARAM2 failed after ${RQ_PARAM2}ms" >&3 ;;
  file) echo "err cannot open /srv/in/$RQ_PARAM2.csv" >&3 ;;
  *) echo "done" >&3 ;;
esac
"""


def rq(layout, *args):
    return subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize(("text", "reason"), [
    ("connect to db01:5432 failed after 3.25s", "connect to dbN:N failed after Ns"),
    ("cannot open /srv/in/77.csv: no such file", "cannot open PATH: no such file"),
    ("relay to http://h:3333/q/a/20250101.0000.00.000.1 refused", "relay to URL refused"),
    ("job 20250101.0000.00.000.12 hash deadbeef99 x", "job ID hash HEX x"),
])
def test_reasons_mask_what_varies(text, reason):
    assert normalise(text) == reason


def _errs(proc, *params):
    ids = [send(proc, param1=p1, param2=p2) for p1, p2 in params]
    for msg_id in ids:
        assert settle(proc, msg_id)["state"] == "err"
    return ids


def test_groups_counted_then_retried_and_deleted_a_group_at_a_time(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    db = _errs(proc, ("db", "5432"), ("db", "6543"), ("db", "17"))
    files = _errs(proc, ("file", "1"), ("file", "22"))
    groups = proc.call("groups")["groups"]
    assert [(g["reason"], g["count"]) for g in groups] == [
        ("connect to dbN:N failed after Nms", 3), ("cannot open PATH", 2)]
    assert groups[0]["first_seen"] <= groups[0]["last_seen"]
    # a new failure after the groups were built is counted at once
    db += _errs(proc, ("db", "1"))
    assert proc.call("groups")["groups"][0]["count"] == 4
    # retry the db group once the cause is fixed: all of it runs again and is done
    (layout.queue_dir("q") / "fixed").write_text("")
    key = groups[0]["key"]
    assert proc.call("group", group=key, action="retry")["count"] == 4
    for msg_id in db:
        assert settle(proc, msg_id)["status"] == "fixed"
    events = timeline.read(store_of(layout, "q").msg_dir("done", db[0]))
    assert [e["ev"] for e in events][-5:] == ["retried", "started", "status", "exit", "done"]
    assert [g["count"] for g in proc.call("groups")["groups"]] == [2]
    # and delete the other
    other = proc.call("groups")["groups"][0]["key"]
    assert proc.call("group", group=other, action="delete")["count"] == 2
    assert proc.call("groups")["groups"] == [] and proc.call("counts")["counts"]["err"] == 0
    with pytest.raises(NotFound, match="no failure group"):
        proc.client().call("group", group=other, action="delete")
    with pytest.raises(BadRequest, match="invalid failure group"):
        proc.client().call("group", group="../x", action="retry")
    with pytest.raises(BadRequest, match="unknown group action 'move'"):
        proc.client().call("group", group=other, action="move")
    assert all(store_of(layout, "q").find(msg_id) == "done" for msg_id in db)
    assert not any(store_of(layout, "q").msg_dir("err", m).exists() for m in files)


def test_cli_groups_and_retry(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    one, two = _errs(proc, ("db", "1"), ("file", "2"))
    lines = rq(layout, "groups", "q").stdout.splitlines()
    assert len(lines) == 2 and all(line.split()[1] == "1" for line in lines)
    assert sorted(line.split(" ", 4)[4] for line in lines) == [
        "cannot open PATH", "connect to dbN:N failed after Nms"]
    done = proc.call("create", msg={})["msg_id"]
    settle(proc, done)
    refused = rq(layout, "retry", done)
    assert refused.returncode == 1 and refused.stderr == f"rq: message {done} is in done, " \
                                                          "not err\n"
    nogroup = rq(layout, "retry", "--group", "0123456789ab")
    assert nogroup.returncode == 1 and nogroup.stderr == "rq: --group needs --queue\n"
    (layout.queue_dir("q") / "fixed").write_text("")
    assert rq(layout, "retry", one).stdout == f"retried {one}\n"
    assert rq(layout, "retry", "--all-err", "q").stdout == "retried 1\n"
    for msg_id in (one, two):
        assert settle(proc, msg_id)["state"] == "done"


def test_http_groups_and_group_action(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    _errs(proc, ("db", "1"), ("db", "2"))
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = falcon.testing.TestClient(create_app(layout, config.load_system_config(layout)))
    groups = client.simulate_get("/q/q/groups.json").json
    assert [g["count"] for g in groups] == [2]
    path = f"/q/q/groups/{groups[0]['key']}"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    bad = client.simulate_post(path, body="_method=move", headers=form)
    assert bad.status_code == 400 and bad.json == ["fail", "_method must be retry or delete"]
    badkey = client.simulate_post("/q/q/groups/zz", body="_method=delete", headers=form)
    assert badkey.status_code == 400 and "invalid failure group" in badkey.json[1]
    got = client.simulate_post(path, body="_method=delete", headers=form)
    assert got.status_code == 200 and got.json == ["ok", 2]
    assert client.simulate_get("/q/q/groups.json").json == []
