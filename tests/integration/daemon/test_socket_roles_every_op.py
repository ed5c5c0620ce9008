"""Every socket op, as an outsider in group rq-view would try it: a viewer once
ran a failure group's retry and delete (``{"op": "group", ...}``) on a
queue's socket.  Each op a plain queue's daemon serves, with each value of
the fields that choose what it does (``action``, ``oper``, ``state``), is
sent by user nobody in group rq-view with valid arguments (real ids, the
real failure group, a real second queue), and again claiming in ``actor``
to act for an admin: every op that can change state
(``roles.mutates``) is refused as Forbidden, every read is answered, and the
queues are as they were.  The table of roles names every op (none is an
admin's by default unnoticed), and an operator's group retry works: the
refusal was the role, not the request."""
# ruff: noqa: F811  (groups, a fixture from peer_client, is a parameter here)

from __future__ import annotations

import itertools
from unittest import mock

import pytest
from conftest import wait_for
from daemon_util import send
from peer_client import ask_as, groups  # noqa: F401

from rqsys.daemon import observe, ops
from rqsys.daemon.searchops import SearchOps
from rqsys.store import STATES
from rqsys.wire import roles, schema

# a plain (non-pool) queue's ops, merged as rqsys.daemon.loop.Loop._server merges them
SCHEMAS = {**schema.OPS, **observe.SCHEMAS}
CHOICES = ("action", "oper", "state")  # the enum fields that choose what an op does
ERRS = 3




def every_request(err_id: str, prep_id: str, group: str) -> list[dict]:
    """One request per op and per value of each of its CHOICES (and without an
    optional one), each valid by the op's schema; watch last (it may stay open)."""
    valid = {"msg_id": err_id, "group": group, "msgs": [{"dest": "q"}], "msg": {"dest": "q"},
             "name": "notes.txt", "md5": "0" * 32, "days": 0}
    extra = {"create": {"msg": {"dest": "q"}}, "prune": {"days": 0},
             "commit": {"msg_id": prep_id}, "attach": {"msg_id": prep_id}}
    found = []
    for op, op_schema in SCHEMAS.items():
        props, required = op_schema["properties"], op_schema.get("required", [])
        given = {f: valid[f] for f in required if f not in ("op", *CHOICES)}
        base = {"op": op, **given, **extra.get(op, {})}
        choices = [[(f, v) for v in props[f]["enum"]] + ([] if f in required else [None])
                   for f in CHOICES if "enum" in props.get(f, {})]
        for combo in itertools.product(*choices):
            req = dict(base, **dict(c for c in combo if c is not None))
            if req.get("action") == "move":
                req["dest"] = "q2"
            # and again claiming to act for an admin (believed from an admin peer only)
            for one in (req, dict(req, actor={"user": "root", "role": "admin"})):
                schema.Checker(SCHEMAS).check(op, one)  # a refusal below is not a bad request
                found.append(one)
    return sorted(found, key=lambda r: r["op"] == "watch")


def snapshot(proc, q2, group: str) -> dict:
    """Each state's ids, the admin state, the failure group's members, q2's counts."""
    members = proc.call("groups", group=group, limit=1000)
    return {"ids": {s: sorted(proc.call("list", state=s, limit=1000)["ids"]) for s in STATES},
            "admin": proc.call("counts")["admin"], "group": sorted(members["ids"]),
            "group_total": members["total"], "q2": q2.call("counts")["counts"]}


@pytest.fixture
def failing(make_queue, daemon):
    """Queue q (its script fails) with ERRS messages in err, one failure group
    of them, and one in prep; queue q2, empty."""
    make_queue("q", "exit 1")
    make_queue("q2", "echo done >&3")
    proc, q2 = daemon("q"), daemon("q2")
    errs = [send(proc, dest="q") for _ in range(ERRS)]
    wait_for(lambda: sorted(proc.call("list", state="err", limit=1000)["ids"]) == sorted(errs),
             20, "the messages to fail")
    wait_for(lambda: [g["count"] for g in proc.call("groups")["groups"]] == [ERRS],
             20, "one failure group of them all")
    prep = proc.call("create", msg={"dest": "q"}, state="prep")["msg_id"]
    return proc, q2, errs, prep, proc.call("groups")["groups"][0]["key"]


def test_a_viewer_is_refused_every_op_that_changes_state(layout, failing, groups):
    proc, q2, errs, prep, group = failing
    before = snapshot(proc, q2, group)
    assert before["group"] == sorted(errs) and before["ids"]["prep"] == [prep]
    assert sum(before["q2"].values()) == 0
    requests = every_request(errs[0], prep, group)
    assert {"group", "bulk", "retry", "delete", "adminoper"} <= {r["op"] for r in requests}
    answers = ask_as(layout, [groups["rq-view"]], *requests)
    assert len(answers) == len(requests)
    for req, answer in zip(requests, answers, strict=True):
        if roles.mutates(req["op"]):
            assert answer["ok"] is False and answer["kind"] == "Forbidden", (req, answer)
            assert "(you have: viewer)" in answer["error"], (req, answer)
        else:  # a read: answered, so the peer was a viewer indeed
            assert answer["ok"] is True, (req, answer)
    after = snapshot(proc, q2, group)
    assert after == before
    assert after["group_total"] == ERRS


def test_every_op_served_has_its_role_named_and_no_read_mutates():
    served = set(ops.table(mock.Mock(), mock.Mock()))
    observer = mock.Mock()
    observer.search.ops.return_value = SearchOps.ops(mock.Mock())
    served |= set(observe.Observer.ops(observer))
    assert served == set(SCHEMAS)  # the first test's list is the daemon's whole table
    assert served - set(roles.OPS) == set()  # none falls to the admin default unnamed
    reads = {op for op, role in roles.OPS.items() if role == "viewer"}
    assert reads & roles.MUTATING == set()
    assert {"group", "bulk", "retry"} <= roles.MUTATING
    assert all(roles.op_role(op) != "viewer" for op in roles.MUTATING)
    assert all(roles.mutates(op) == (op in roles.MUTATING) for op in served)
    assert roles.mutates("no-such-op")  # an op not named is taken as one that changes


def test_an_operator_retries_the_group(layout, failing, groups):
    proc, _q2, errs, _prep, group = failing
    (answer,) = ask_as(layout, [groups["rq"]], {"op": "group", "group": group,
                                                "action": "retry"})
    assert answer == {"ok": True, "count": ERRS}
    # retried, they run again and fail again (the script still exits 1)
    wait_for(lambda: all(proc.call("status", msg_id=m)["state"] == "err" for m in errs)
             and proc.call("counts")["counts"]["que"] == 0, 20, "the retried ones to end")
