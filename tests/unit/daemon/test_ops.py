"""Unit tests of the socket operations (rqsys.daemon.ops and intake's) in
this process: a daemon built on a real store in a temp dir but never
started (no socket, no loop, no script), its handlers called with requests
checked by their schema, its background jobs run by ``drain``."""

from __future__ import annotations

import json
import math
import os

import pytest
from daemon_util import drain, install_with_script

from rqsys import tunables
from rqsys.daemon import observe
from rqsys.daemon.loop import QueueDaemon
from rqsys.daemon.server import Request
from rqsys.errors import BadRequest, NotFound, QueueDown
from rqsys.observe.events import EventLog
from rqsys.wire import framing, schema


class Daemon:
    """A QueueDaemon's rooms over queue ``q``, loaded as at start-up."""

    def __init__(self, layout, **cfg):
        install_with_script(layout, "q", "/bin/true", **cfg)
        self.d = QueueDaemon(layout, "q", log=EventLog("q", journal=False))
        self.d.queload.start()
        self.d.queload.read()

    def call(self, op, fds=(), **args):
        """The answer to one request, waiting for one that comes later."""
        answers = []
        args = {"op": op, **args}
        self.d.server.checker.check(op, args)
        reply = self.d.server.ops[op](Request(op, args, list(fds), answers.append,
                                              self.d.server.error_reply))
        self.d.intake.publish_pending()  # as the loop does after every turn
        drain(self.d.background)
        if reply is not None:
            answers.append(reply)
        assert len(answers) == 1, answers
        return framing.raise_for(answers[0])


@pytest.fixture
def q(layout):
    return Daemon(layout)


def test_every_op_has_a_schema_and_a_handler(q):
    # The server refuses to start with an op lacking either (Server.__init__)
    assert set(q.d.server.ops) == set(schema.OPS) | set(observe.SCHEMAS)


def test_ping_counts_and_config(q):
    assert q.call("ping") == {"ok": True, "queue": "q", "pid": os.getpid()}
    counts = q.call("counts")
    assert counts["counts"] == dict.fromkeys(("prep", "que", "run", "done", "err",
                                              "relayed"), 0)
    assert counts["admin"] == "UP" and counts["status"] == "que 0, run 0/1, done 0, err 0"
    assert q.call("config")["config"]["name"] == "q"


def test_create_then_read_it_back(q):
    created = q.call("create", msg={"param1": "p"})
    msg_id = created["msg_id"]
    assert created["url"].endswith(f"/q/q/{msg_id}")
    assert q.call("state", msg_id=msg_id)["state"] == "que"
    got = q.call("get", msg_id=msg_id)
    assert got["msg"]["param1"] == "p" and got["attachments"] == {} and got["status"] == ""
    assert q.call("status", msg_id=msg_id) == {"ok": True, "state": "que", "status": ""}
    assert q.call("create", msg={"param1": "p"}, single=True)["msg_id"] == msg_id


def test_list_is_cut_to_max_list(q, monkeypatch):
    monkeypatch.setattr(tunables, "MAX_LIST", 2)
    ids = [q.call("create", msg={})["msg_id"] for _ in range(3)]
    assert q.call("list", state="que", limit=50) == {"ok": True, "ids": ids[:2], "total": 3}
    assert q.call("list", state="que", offset=2)["ids"] == ids[2:]


def test_commit_is_answered_once_durable_and_twice_is_fine(q):
    msg_id = q.call("create", msg={}, state="prep")["msg_id"]
    assert q.call("commit", msg_id=msg_id)["url"].endswith(msg_id)
    assert q.call("state", msg_id=msg_id)["state"] == "que"
    assert q.call("commit", msg_id=msg_id)["already"] == "que"
    with pytest.raises(NotFound):
        q.call("commit", msg_id="20200101.0000.00.000.0")


def test_adminoper_is_in_force_once_durable(q, layout):
    assert q.call("adminoper", oper="down") == {"ok": True, "admin": "DOWN"}
    assert (layout.queue_dir("q") / "admin_state").read_text() == "DOWN\n"
    with pytest.raises(QueueDown, match="DOWN"):
        q.call("create", msg={})
    assert q.call("adminoper", oper="resume")["admin"] == "UP"
    with pytest.raises(BadRequest, match="unknown admin operation 'explode'"):
        q.call("adminoper", oper="explode")


@pytest.mark.parametrize("op", ["delete", "destroy"])
def test_delete_and_destroy_of_a_message_not_running(q, op):
    msg_id = q.call("create", msg={})["msg_id"]
    assert q.call(op, msg_id=msg_id) == {"ok": True}
    with pytest.raises(NotFound):
        q.call("state", msg_id=msg_id)
    assert q.call("counts")["counts"]["que"] == 0


def test_run_now(q):
    msg_id = q.call("create", msg={"due": 4e9})["msg_id"]
    assert q.call("run_now", msg_id=msg_id) == {"ok": True}
    assert q.call("get", msg_id=msg_id)["msg"]["due"] == 0


@pytest.mark.parametrize("days", [math.nan, -1])
def test_prune_refuses_days_below_zero_and_nan(q, days):
    with pytest.raises(BadRequest, match="days"):
        q.call("prune", days=days)


def test_prune(q):
    q.call("create", msg={}, state="prep")
    assert q.call("prune", days=0, prep_days=0)["removed"] == {"done": 0, "relayed": 0,
                                                               "err": 0, "prep": 1}
    assert q.call("counts")["counts"]["prep"] == 0


def test_reload_reads_the_new_config(q, layout):
    path = layout.queue_dir("q") / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(dict(cfg, num_workers=3)))
    assert q.call("reload") == {"ok": True}
    assert q.call("counts")["num_workers"] == 3


@pytest.mark.parametrize(("op", "args", "words"), [
    ("get", {"msg_id": "../x"}, "invalid message id: '../x'"),
    ("get", {}, "'msg_id' is a required property"),
    ("list", {"state": "nosuch"}, "unknown state 'nosuch'"),
    ("list", {"offset": -1}, "offset"),
    ("create", {"msg": {}, "attachments": [{"name": "../x", "md5": "0" * 32}]},
     "invalid attachment name"),
    ("attach", {"msg_id": "20200101.0000.00.000.0", "name": "a", "md5": "x"}, "md5"),
    ("ping", {"extra": 1}, "'extra' was unexpected"),
    ("prune", {"prep_days": "7"}, "prep_days"),
])
def test_requests_are_checked_before_any_handler_and_the_error_names_the_field(
        q, op, args, words):
    with pytest.raises(BadRequest, match=words):
        q.d.server.checker.check(op, {"op": op, **args})


def test_a_bug_is_answered_as_internal_error_and_logged(q, capsys):
    try:
        {}["oops"]
    except KeyError as exc:
        reply = q.d.server.error_reply("get", exc)
    assert reply["ok"] is False and reply["kind"] == "InternalError"
    assert reply["error"].startswith("internal error: KeyError in get")
    assert "oops" not in reply["error"]  # the detail is for the log, not the client
    logged = capsys.readouterr().err
    assert "internal error in get: KeyError('oops')" in logged
    assert "Traceback" in logged and 'in test_a_bug_is_answered' in logged


def test_a_failing_disk_is_a_store_error_not_a_bug(q):
    reply = q.d.server.error_reply("commit", OSError(28, "No space left on device"))
    assert reply == {"ok": False, "kind": "StoreError",
                     "error": "store error: No space left on device"}
