"""Text no message may hold, sent to a real daemon over its socket and over
HTTP: a lone UTF-16 surrogate (a single such create crash-looped its queue's
daemon: the start could not pass it to exec) and NaN or Infinity (a ``due``
of NaN never came).  Each is refused with a clear error; the queue goes on."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlencode

import pytest
from conftest import wait_for, web_client
from daemon_util import send, settle, store_of

from rqsys.errors import BadRequest
from rqsys.wire.client import QueueClient

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize(("msg", "why"), [
    ({"param1": "\ud800"}, "lone UTF-16 surrogate"),
    ({"param1": "ok", "tags": ["\udfff"]}, "lone UTF-16 surrogate"),
    ({"param1": "ok", "\udc80": "x"}, "lone UTF-16 surrogate"),
    ({"due": float("nan")}, "NaN is not a JSON number"),
    ({"timeout": float("inf")}, "Infinity is not a JSON number"),
])
def test_the_socket_refuses_what_no_message_may_hold(make_queue, daemon, msg, why):
    make_queue("q", 'echo "done $RQ_PARAM1" >&3\n')
    proc = daemon("q")
    with pytest.raises(BadRequest, match=why):
        proc.client().call("create", msg=msg)
    # And the queue goes on: a surrogate pair is one character, and runs
    got = settle(proc, send(proc, param1="\ud83d\ude00"))
    assert (got["state"], got["status"]) == ("done", "\U0001f600")
    assert proc.call("counts")["counts"]["que"] == 0


@pytest.mark.parametrize(("form", "why"), [
    ({"mesg": '{"param1": "\\ud800"}'}, b"lone UTF-16 surrogate"),
    ({"mesg": '{"due": NaN}'}, b"NaN is not a JSON number"),
    ({"mesg_due": "nan"}, b"mesg_due must be a number"),
    ({"mesg_timeout": "inf"}, b"mesg_timeout must be a number"),
])
def test_http_refuses_what_no_message_may_hold(make_queue, daemon, layout, form, why):
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    client = web_client(layout)
    got = client.simulate_post("/q/q/new_message", body=urlencode(form), headers=FORM)
    assert got.status_code == 400 and why in got.content, (got.status, got.text)
    assert proc.call("counts")["counts"]["que"] == 0 and json.loads(got.text)[0] == "fail"


def test_a_stored_message_with_a_lone_surrogate_ends_in_err_alone(layout, make_queue, daemon):
    # Given a message stored with a lone surrogate before intake refused them
    make_queue("q", 'echo "done $RQ_PARAM1" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    bad = send(proc, param1="placeholder")
    proc.stop()
    path = store_of(layout, "q").msg_dir("que", bad) / "msg"
    path.write_text(path.read_text().replace("placeholder", "\\ud800"))
    # When the daemon starts it (its start raised, and the daemon died each time)
    proc = daemon("q")
    proc.call("adminoper", oper="up")
    got = settle(proc, bad)
    # Then it alone ends in err saying why, and the queue and its index go on
    assert got["state"] == "err" and "lone UTF-16 surrogate" in got["status"], got
    assert settle(proc, send(proc, param1="next"))["status"] == "next"
    wait_for(lambda: proc.call("search", text="next")["total"] == 1, 10, "the index")
    assert proc.call("stats")["index"]["failed"] == 0


@pytest.mark.parametrize(("line", "why"), [
    (b'{"op":"create","msg":{"param1":"\xed\xa0\x80"}}\n', "lone UTF-16 surrogate"),
    (b'{"op":"create","msg":{"due":1e999}}\n', "out of range for a number"),
])
def test_raw_bytes_on_the_socket_are_refused_too(layout, make_queue, daemon, line, why):
    # a surrogate's UTF-8 bytes (no \\u escape: json takes them) and a number too
    # large for a float (it became inf) came through the socket
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(QueueClient(layout, "q").path))
        sock.sendall(line)
        reply = json.loads(sock.makefile("rb").readline())
    assert reply["kind"] == "BadRequest" and why in reply["error"], reply
    assert proc.call("counts")["counts"]["que"] == 0
