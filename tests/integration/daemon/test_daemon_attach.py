"""Attachments are checked off the daemon's loop: a real daemon keeps
answering while a large file is hashed, answers one connection in the order
of its requests, and drops a file whose message moved on meanwhile."""

from __future__ import annotations

import functools
import hashlib
import socket
import threading
import time

import pytest
from daemon_util import stray_temps

from rqsys.wire import framing

SIZE = 1 << 29  # sparse: hashing it reads 512 MiB of zeros (about a second), writing it nothing


@functools.cache
def md5_of_zeros(size: int) -> str:
    digest, chunk = hashlib.md5(), bytes(1 << 20)
    for _ in range(size // len(chunk)):
        digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture
def big_file(tmp_path):
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(SIZE)
    return path, md5_of_zeros(SIZE)


@pytest.fixture
def prep(layout, make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    return proc, proc.call("create", state="prep", msg={})["msg_id"]


def attach_in_thread(proc, msg_id, path, md5):
    """Start an attach on its own connection; returns (thread, result dict)."""
    result: dict = {}

    def run():
        with open(path, "rb") as f, proc.client() as client:
            try:
                result["reply"] = client.call("attach", fds=[f.fileno()], msg_id=msg_id,
                                              name="big.bin", md5=md5)
            except Exception as exc:  # the test looks at it
                result["error"] = exc
        result["done_at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def read_answers(sock, count):
    lines, answers = framing.LineBuffer(), []
    sock.settimeout(60)
    while len(answers) < count:
        data, _fds = framing.recv(sock)
        assert data, "the daemon closed the connection"
        lines.feed(data, [])
        while (got := lines.next_line()) is not None:
            answers.append(framing.decode(got[0]))
    return answers


def test_the_daemon_answers_while_a_large_attachment_is_checked(prep, big_file):
    # Given an attach of a 512 MiB file in flight (its MD5 takes a second)
    proc, msg_id = prep
    path, md5 = big_file
    thread, result = attach_in_thread(proc, msg_id, path, md5)
    time.sleep(0.2)
    # When another client pings and creates meanwhile
    started = time.monotonic()
    assert proc.call("ping")["ok"]
    created = proc.call("create", msg={"param1": "meanwhile"})["msg_id"]
    answered = time.monotonic()
    thread.join(60)
    # Then those were answered at once, before the attach ended
    assert answered - started < 0.5
    assert "done_at" in result and answered < result["done_at"], result
    # And the attach went through, checked
    assert result["reply"]["size"] == SIZE and result["reply"]["md5"] == md5
    info = proc.call("get", msg_id=msg_id)["attachments"]["big.bin"]
    assert info["md5"] == md5
    assert proc.call("get", msg_id=created)["msg"]["param1"] == "meanwhile"


def test_answers_on_one_connection_keep_the_order_of_its_requests(prep, big_file, layout):
    # Given an attach and a ping sent together on one connection
    proc, msg_id = prep
    path, md5 = big_file
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(layout.socket_path("q")))
    with open(path, "rb") as f:
        framing.send(sock, framing.encode({"op": "attach", "msg_id": msg_id, "name": "big.bin",
                                     "md5": md5}), [f.fileno()])
    framing.send(sock, framing.encode({"op": "ping"}))
    # When both answers are read
    answers = read_answers(sock, 2)
    sock.close()
    # Then the attach's answer comes first, though the ping was ready long before
    assert answers[0]["name"] == "big.bin" and answers[0]["md5"] == md5
    assert answers[1]["queue"] == "q"


def test_a_request_sent_behind_a_create_sees_the_message(prep, layout):
    # Given a paused queue, and a create and a counts sent together on one connection
    proc, _prep_id = prep
    proc.call("adminoper", oper="pause")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(layout.socket_path("q")))
    sock.sendall(framing.encode({"op": "create", "msg": {}}) + framing.encode({"op": "counts"}))
    # When both answers are read
    answers = read_answers(sock, 2)
    sock.close()
    # Then the counts, answered after the create, include the new message
    assert answers[0]["ok"] and answers[1]["counts"]["que"] == 1


def test_an_attachment_whose_message_moved_on_is_refused_and_dropped(prep, big_file, layout):
    # Given an attach in flight
    proc, msg_id = prep
    path, md5 = big_file
    thread, result = attach_in_thread(proc, msg_id, path, md5)
    time.sleep(0.2)
    # When the message is committed before its file is checked
    assert proc.call("commit", msg_id=msg_id)["ok"]
    thread.join(60)
    # Then the attach is refused, and its file is not left anywhere
    assert "not in prep" in str(result.get("error"))
    assert proc.call("get", msg_id=msg_id)["attachments"] == {}
    assert stray_temps(layout) == []
