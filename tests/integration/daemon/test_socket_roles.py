"""Roles on a queue's unix socket (issue 33 item 1): the kernel says who the
client is (SO_PEERCRED, SO_PEERGROUPS), and the daemon answers by the role
that gives: a client run as user nobody in group rq-view may read and is
refused a create, naming the role; in group rq it may create and is
refused a pause; in no group it may do nothing; root may do all."""
# ruff: noqa: F811  (groups, a fixture from peer_client, is a parameter here)

from __future__ import annotations

from peer_client import ask_as, groups  # noqa: F401


def test_a_viewer_reads_and_is_refused_a_create(layout, make_queue, daemon, groups):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    counts, create = ask_as(layout, [groups["rq-view"]], {"op": "counts"},
                            {"op": "create", "msg": {"dest": "q"}})
    assert counts["ok"] is True and "counts" in counts, counts
    assert create == {"ok": False, "kind": "Forbidden",
                      "error": "this needs the operator role (you have: viewer)"}
    assert sum(proc.call("counts")["counts"].values()) == 0


def test_an_operator_sends_and_is_refused_a_pause(layout, make_queue, daemon, groups):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    create, pause = ask_as(layout, [groups["rq"]], {"op": "create", "msg": {"dest": "q"}},
                           {"op": "adminoper", "oper": "pause"})
    assert create["ok"] is True and create["msg_id"]
    assert pause["kind"] == "Forbidden" and "needs the admin role" in pause["error"]
    assert proc.call("counts")["admin"] == "UP"
    # and root (the daemon's own user, as the web and the timers run) may pause
    assert proc.call("adminoper", oper="pause")["admin"] == "PAUSE"


def test_a_user_in_no_group_may_do_nothing(layout, make_queue, daemon, groups):
    make_queue("q", "echo done >&3")
    daemon("q")
    ping, bad = ask_as(layout, [], {"op": "ping"}, {"op": "nonsense"})
    assert ping["kind"] == "Forbidden" and "(you have: none)" in ping["error"]
    assert bad["kind"] == "BadRequest"  # an unknown op is said so, to anyone
