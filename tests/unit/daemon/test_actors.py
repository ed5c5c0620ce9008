"""Who a request is from, as the audit trail and the timelines name it
(rqsys.daemon.audit.actor, Request.actor), and how a timeline line's ``by``
is shown on the message page (rqsys.web.timeshtml)."""

from __future__ import annotations

import os
import pwd
from types import SimpleNamespace

from rqsys.daemon import audit
from rqsys.daemon.audit import actor
from rqsys.daemon.server import Request
from rqsys.web import timeshtml

WEB = {"user": "alice", "address": "10.0.0.5"}


def _conn(role: str) -> SimpleNamespace:
    return SimpleNamespace(role=role, uid=os.getuid(), pid=os.getpid())


def _request(role: str | None, **args) -> Request:
    conn = _conn(role) if role is not None else None
    return Request("retry", args, [], lambda _r: None, lambda _op, _e: {}, conn=conn)


def test_an_admin_peer_is_believed_when_it_names_the_web_user():
    assert actor(_conn("admin"), WEB) == ("alice", "10.0.0.5", "alice (10.0.0.5)")
    assert _request("admin", actor=WEB).actor() == "alice (10.0.0.5)"
    # without basic_auth the web names no user: its client's address stands for it
    assert actor(_conn("admin"), {"address": "10.0.0.5"}).text == "http 10.0.0.5"


def test_another_peer_is_named_by_the_kernel_whatever_actor_it_claims():
    me, comm = pwd.getpwuid(os.getuid()).pw_name, os.readlink("/proc/self/exe")
    for role in ("operator", "viewer"):
        got = actor(_conn(role), WEB)
        assert got.who == me and got.where == f"pid {os.getpid()} ({comm})"
        assert got.text == f"{me} ({comm}, pid {os.getpid()})"
        assert "alice" not in _request(role, actor=WEB).actor()


def test_a_request_made_inside_the_daemon_names_nobody():
    assert _request(None, actor=WEB).actor() == ""


def test_the_page_shows_who_beside_the_event_not_among_its_details():
    rows = timeshtml.events([
        {"t": 1.0, "ev": "retried", "state": "que", "by": "alice (10.0.0.5)",
         "text": "err → que"},
        {"t": 2.0, "ev": "started", "pid": 7},
    ])
    assert [(r["ev"], r["by"], r["details"]) for r in rows] == [
        ("retried", "alice (10.0.0.5)", 'state="que"'), ("started", "", "pid=7")]


def test_a_peer_whose_program_cannot_be_read_is_named_as_it_calls_itself(monkeypatch):
    def unreadable(path):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(os, "readlink", unreadable)
    with open(f"/proc/{os.getpid()}/comm") as f:
        comm = f.read().strip()
    assert audit.program_of(os.getpid()) == f"calls itself {comm}"
    assert audit.program_of(2**22 + 1) == "?"  # above pid_max's default: gone
