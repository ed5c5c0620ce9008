"""The audit's rule is "does it change state" (issue 45): every op that can
(``rqsys.wire.roles.MUTATING``), with each of its actions, performed once on a
real daemon over its real socket leaves exactly one record, named by what it
did; every read leaves none.  The ops are taken from the role table, so one
added there without a case here fails this test."""

from __future__ import annotations

import hashlib
import os
import time

from conftest import wait_for

from rqsys.errors import RQError
from rqsys.observe import auditread
from rqsys.wire import roles

BODY = b"attached\n"


def _records(layout) -> list[dict]:
    return auditread.records(layout.audit_dir, auditread.Filter(queue="q"))


def _ids(proc, state: str) -> list[str]:
    return proc.call("list", state=state, limit=1000)["ids"]


def _err_messages(proc, n: int) -> list[str]:
    made = {proc.call("create", msg={"dest": "q", "param1": f"e{k}"})["msg_id"]
            for k in range(n)}
    wait_for(lambda: made <= set(_ids(proc, "err")), 30, "messages in err")
    return sorted(made)


def _call(proc, op: str, **args) -> dict:
    """The answer, ok or not (a refusal is recorded as well)."""
    try:
        return proc.call(op, **args)
    except RQError as exc:
        return {"ok": False, "error": str(exc)}


def test_every_mutating_op_leaves_one_record_and_no_read_leaves_any(layout, make_queue, daemon,
                                                                    tmp_path):
    make_queue("q", "exit 1")
    make_queue("other", "exit 0")
    proc = daemon("q")
    daemon("other")
    err = _err_messages(proc, 8)
    key = proc.call("groups")["groups"][0]["key"]
    prep = proc.call("create", msg={"dest": "q"}, state="prep")["msg_id"]
    later = [proc.call("create", msg={"dest": "q", "due": time.time() + 3600})["msg_id"]
             for _ in range(2)]
    reads = [("ping", {}), ("counts", {}), ("config", {}), ("list", {"state": "err"}),
             ("get", {"msg_id": err[0]}), ("state", {"msg_id": err[0]}),
             ("status", {"msg_id": err[0]}), ("stats", {}), ("groups", {}),
             ("search", {"state": "err"}), ("watch", {"msg_id": err[0]})]
    before = len(_records(layout))
    for op, args in reads:
        assert _call(proc, op, **args)["ok"] is True, op
    assert len(_records(layout)) == before, "a read was recorded"
    assert {op for op, _a in reads} == set(roles.READS) - {"pool"}  # pool: a pool queue's

    (tmp_path / "a.txt").write_bytes(BODY)
    read = os.open(tmp_path / "a.txt", os.O_RDONLY)
    md5 = hashlib.md5(BODY).hexdigest()
    cases = [  # (op, args, the record's action)
        ("attach", {"msg_id": prep, "name": "a.txt", "md5": md5, "fds": [read]}, "attach"),
        ("commit", {"msg_id": prep}, "commit"),
        ("create", {"msg": {"dest": "q"}}, "create"),
        ("create_many", {"msgs": [{"dest": "q"}, {"dest": "q"}]}, "create_many"),
        ("clone", {"msg_id": err[0]}, "clone"),
        ("retry", {"msg_id": err[1]}, "retry"),
        ("run_now", {"msg_id": later[0]}, "run_now"),
        ("cancel", {"msg_id": later[1]}, "cancel"),
        ("delete", {"msg_id": err[2]}, "delete"),
        ("destroy", {"msg_id": err[3]}, "destroy"),
        ("bulk", {"action": "retry", "ids": [err[4]]}, "bulk_retry"),
        ("bulk", {"action": "delete", "ids": [err[5]], "state": "err"}, "bulk_delete"),
        ("bulk", {"action": "move", "ids": [err[6]], "dest": "other"}, "bulk_move"),
        ("group", {"group": key, "action": "retry"}, "group_retry"),
        ("group", {"group": key, "action": "delete"}, "group_delete"),
        *[("adminoper", {"oper": oper}, oper) for oper in ("pause", "resume", "down", "up")],
        ("reload", {}, "reload"),
        ("prune", {"days": 0}, "prune"),
    ]
    assert {op for op, _a, _w in cases} == set(roles.MUTATING)
    for op, args, action in cases:
        if op == "group":  # the retried ones ended in err again first
            wait_for(lambda: not _ids(proc, "que") and not _ids(proc, "run"), 30, "the runs")
        got = _call(proc, op, **args)
        assert got.get("ok") is True, (op, args, got)
        recs = _records(layout)
        new = recs[:len(recs) - before]  # newest first
        assert [r["action"] for r in new] == [action], (op, args, new)
        assert new[0]["result"] == "ok"
        before = len(recs)
    os.close(read)


def test_a_refused_group_action_is_recorded_as_refused(layout, make_queue, daemon):
    # A viewer's group retry is refused by its role, and the refusal is on the record
    make_queue("q", "exit 1")
    proc = daemon("q")
    _err_messages(proc, 2)
    key = proc.call("groups")["groups"][0]["key"]
    viewer = {"user": "vic", "address": "10.0.0.9", "role": "viewer"}
    got = _call(proc, "group", group=key, action="delete", actor=viewer)
    assert got["ok"] is False and "needs the operator role on queue q (you have: viewer)" \
        in got["error"]
    rec = _records(layout)[0]
    assert (rec["actor"], rec["action"], rec["result"]) == ("vic", "group_delete", "refused")
    assert len(_ids(proc, "err")) == 2
