"""Unique messages (``unique_key``, ``unique_for``) through a real daemon,
its socket, the ``rq`` CLI and concurrent clients."""

# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from daemon_util import settle, write_gate
from web_support import web_server  # noqa: F401

from rqsys.daemon.unique import ENDED_FILE, UniqueIndex, key_of
from rqsys.errors import BadRequest
from rqsys.wire.client import QueueClient

GATED = 'while [ ! -e "$GATE" ]; do sleep 0.02; done; echo "done ok" >&3'


def _gated(make_queue, tmp_path, **cfg):
    make_queue("q", GATED, env_vars={"GATE": str(tmp_path / "gate")}, **cfg)
    return tmp_path / "gate"


def test_sixteen_concurrent_creators_make_exactly_one_message(layout, make_queue, daemon,
                                                               tmp_path):
    # Given a paused queue, and 16 clients ready to send the same unique key at once
    _gated(make_queue, tmp_path)
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    barrier, replies = threading.Barrier(16), []

    def send() -> None:
        with QueueClient(layout, "q") as client:
            barrier.wait()
            replies.append(client.call("create", msg={"unique_key": "nightly"}))

    threads = [threading.Thread(target=send) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # Then one message exists; every client got its URL, 15 of them flagged duplicate
    assert len(replies) == 16
    assert len({r["msg_id"] for r in replies}) == 1
    assert sorted(bool(r.get("duplicate")) for r in replies) == [False] + [True] * 15
    assert proc.call("counts")["counts"]["que"] == 1


def test_key_held_while_queued_across_restart_and_freed_when_done(layout, make_queue, daemon,
                                                                  tmp_path):
    gate = _gated(make_queue, tmp_path)
    proc = daemon("q")
    first = proc.call("create", msg={"unique_key": "k", "param1": "a"})["msg_id"]
    proc.stop()
    # After a restart, the running-then-requeued message still holds the key
    proc = daemon("q")
    again = proc.call("create", msg={"unique_key": "k", "param1": "b"})
    assert again["msg_id"] == first and again["duplicate"] is True
    # Another key is a new message
    other = proc.call("create", msg={"unique_key": "k2"})
    assert other["msg_id"] != first and "duplicate" not in other
    write_gate(gate)
    assert settle(proc, first)["state"] == "done"
    # Without unique_for the key is free once its message ended
    fresh = proc.call("create", msg={"unique_key": "k"})
    assert fresh["msg_id"] != first and "duplicate" not in fresh


def test_unique_for_holds_the_key_after_the_end_across_restart(layout, make_queue, daemon,
                                                               tmp_path):
    write_gate(_gated(make_queue, tmp_path))
    proc = daemon("q")
    msg = {"unique_key": "params", "param1": "x", "unique_for": 3600}
    first = proc.call("create", msg=msg)["msg_id"]
    assert settle(proc, first)["state"] == "done"
    assert proc.call("create", msg=msg)["msg_id"] == first
    # other params make another key
    assert proc.call("create", msg=dict(msg, param1="y"))["msg_id"] != first
    proc.stop()
    proc = daemon("q")
    assert proc.call("create", msg=msg) == {"ok": True, "msg_id": first, "duplicate": True,
                                            "url": proc.call("get", msg_id=first)["url"]}
    # Deleting the holder frees its key
    proc.call("delete", msg_id=first)
    assert proc.call("create", msg=msg)["msg_id"] != first


def test_an_ended_window_expires(tmp_path):
    index = UniqueIndex(tmp_path)
    index.hold("m1", {"unique_key": "k", "unique_for": 10})
    index.ended("m1", now=100.0)
    assert index.holder(key_of({"unique_key": "k"}) or "", 109.0) == "m1"
    assert index.holder(key_of({"unique_key": "k"}) or "", 110.0) is None
    # and a start drops expired lines from the file
    later = UniqueIndex(tmp_path)
    later.load([], now=200.0)
    assert (tmp_path / ENDED_FILE).read_text() == ""


def test_garbage_in_the_ended_file_frees_its_keys_alone(tmp_path):
    # Given an ended window whose file got a garbage block after a power cut
    index = UniqueIndex(tmp_path)
    index.hold("m1", {"unique_key": "k", "unique_for": 100})
    index.ended("m1", now=100.0)
    with open(tmp_path / ENDED_FILE, "ab") as f:
        f.write(b"\xff\xfe\x00garbage\n")
    # When a daemon starts (the bytes that are not UTF-8 failed every start)
    later = UniqueIndex(tmp_path)
    later.load([], now=150.0)
    # Then the whole lines still hold their keys
    assert later.holder(key_of({"unique_key": "k"}) or "", 150.0) == "m1"


def test_literal_and_params_keys_never_collide():
    assert key_of({"unique_key": "params", "param1": "a"}) != key_of({"unique_key": '["params"'})
    assert key_of({}) is None


BAD_FIELDS = [
    ({"unique_for": 5}, "unique_for needs a unique_key"),
    ({"unique_key": ""}, "unique_key"),
    ({"unique_key": 7}, "unique_key"),
    ({"unique_key": "k", "unique_for": -1}, "unique_for"),
    ({"unique_key": "k", "unique_for": "soon"}, "unique_for"),
    ({"unique_key": "x" * 1025}, "unique_key"),
]


def test_bad_unique_fields_are_refused_naming_the_field(layout, make_queue, daemon):
    make_queue("q", 'echo "done" >&3')
    proc = daemon("q")  # one daemon for every case: each is refused alone
    for msg, why in BAD_FIELDS:
        with pytest.raises(BadRequest, match=why):
            proc.call("create", msg=msg)
    assert proc.call("counts")["counts"]["que"] == 0


def test_rq_sendmesg_unique_key_says_duplicate(layout, make_queue, daemon, tmp_path):
    _gated(make_queue, tmp_path)
    daemon("q")

    def rq(*args: str) -> subprocess.CompletedProcess[str]:
        code = "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main(sys.argv[1:]))"
        return subprocess.run([sys.executable, "-c", code, "--root", str(layout.root), *args],
                              capture_output=True, text=True, timeout=30)

    first = rq("sendmesg", "--dest", "q", "--unique-key", "job-1")
    second = rq("sendmesg", "--dest", "q", "--unique-key", "job-1", "--unique-for", "60")
    assert first.returncode == 0 and second.returncode == 0
    assert first.stdout == second.stdout and first.stdout.startswith("ok http")
    assert "duplicate" in second.stderr and "duplicate" not in first.stderr
    bad = rq("sendmesg", "--dest", "q", "--unique-for", "60")
    assert bad.returncode == 1 and "unique_for needs a unique_key" in bad.stderr


def test_http_answers_rq_ok_url_and_a_duplicate_header(layout, make_queue, daemon, tmp_path,
                                                       web_server):
    from urllib.parse import urlencode
    _gated(make_queue, tmp_path)
    daemon("q")
    server = web_server()
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    def post(mesg: str):
        status, headers, data = server.request("POST", "/q/q/new_message",
                                               urlencode({"mesg": mesg}), form)
        return status, headers.get("RQ-Duplicate"), json.loads(data)

    # RQ's form encoding: numbers as strings
    first = post('{"unique_key": "k", "unique_for": "60"}')
    second = post('{"unique_key": "k"}')
    assert first[0] == second[0] == 200 and first[2][0] == "ok" and first[2] == second[2]
    assert first[1] is None and second[1] == "true"
    status, _dup, body = post('{"unique_key": "k", "unique_for": "later"}')
    assert status == 400 and body[0] == "fail" and "unique_for" in body[1]
    # the web form's mesg_unique_key and mesg_unique_for fields
    fields = {"mesg_param1": "x", "mesg_unique_key": "form", "mesg_unique_for": "30"}
    first, second = server.form("/q/q/new_message", fields), server.form("/q/q/new_message",
                                                                          fields)
    assert first[0] == second[0] == 200 and first[1] == second[1] and first[1][0] == "ok"
    status, body = server.form("/q/q/new_message", dict(fields, mesg_unique_for="soon"))
    assert status == 400 and body == ["fail", "mesg_unique_for must be a number, not 'soon'"]


def test_a_pool_queue_refuses_a_prep_messages_unique_key(layout, make_queue, daemon, tmp_path):
    # (a pool queue holds its other keys in the pool: tests/system/test_pool_keys.py)
    from conftest import need
    from nats_util import LocalNats, nats_available

    need(nats_available(), "nats-server (Debian package nats-server)")
    server = LocalNats(tmp_path / "nats")
    try:
        layout.config_file.write_text(json.dumps({"host": "127.0.0.1", "port": 3333, "nats": {
            "servers": [server.url], "connect_timeout": 1}}))
        make_queue("pq", 'echo "done" >&3\n', pool={"name": "pu", "replicas": 1})
        pq = daemon("pq")
        with pytest.raises(BadRequest, match="unique_key: not taken by a pool queue's prep"):
            pq.call("create", msg={"unique_key": "k"}, state="prep")
        assert pq.call("create", msg={"param1": "plain"})["msg_id"]
    finally:
        server.stop()


def test_a_message_retried_from_err_holds_its_key_again(layout, make_queue, daemon):
    make_queue("q", 'if [ "$RQ_PARAM1" = fail ]; then echo "err no" >&3; exit 0; fi\n'
               'sleep 30; echo "done" >&3\n')
    proc = daemon("q")
    failed = proc.call("create", msg={"unique_key": "k", "param1": "fail"})["msg_id"]
    assert settle(proc, failed)["state"] == "err"
    proc.call("adminoper", oper="pause")
    proc.call("retry", msg_id=failed)
    again = proc.call("create", msg={"unique_key": "k", "param1": "other"})
    assert again["msg_id"] == failed and again["duplicate"] is True
