"""Bad input never kills the queue daemon: each gets a clear error, nothing is
lost, and the daemon answers the next request."""

from __future__ import annotations

import hashlib
import json
import os
import socket

import pytest
from conftest import wait_for
from daemon_util import job_file, pid_alive, send, settle, store_of, stray_temps

from rqsys.errors import BadRequest
from rqsys.wire.client import QueueClient


def _raw(layout, name, payload: bytes) -> dict:
    """Send raw bytes on a fresh connection; return the decoded answer line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(layout.socket_path(name)))
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon answered and closed before reading it all
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


@pytest.fixture
def q(make_queue, daemon):
    make_queue("q", 'echo "done $RQ_PARAM1" >&3')
    return daemon("q")


def _still_serving(proc):
    assert proc.call("ping")["queue"] == "q"
    assert settle(proc, send(proc, param1="after"))["status"] == "after"


@pytest.mark.parametrize("payload", [
    b"this is not json\n", b"[1, 2, 3]\n", b'"just a string"\n', b"\xff\xfe\n",
    b'{"op": 5}\n', b'{"no_op": true}\n'])
def test_bad_json_or_shape(layout, q, payload):
    reply = _raw(layout, "q", payload)
    assert reply["ok"] is False and reply["error"]
    _still_serving(q)


def test_unknown_op(layout, q):
    reply = _raw(layout, "q", b'{"op": "format_disk"}\n')
    assert reply == {"ok": False, "error": "unknown operation 'format_disk'", "kind": "BadRequest"}
    _still_serving(q)


def test_connection_survives_a_bad_line(layout, q):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(layout.socket_path("q")))
        sock.sendall(b"garbage\n" + b'{"op": "ping"}\n')
        lines = b""
        while lines.count(b"\n") < 2:
            lines += sock.recv(4096)
    first, second = (json.loads(x) for x in lines.splitlines())
    assert first["ok"] is False and second["ok"] is True


def test_oversized_request_line(layout, q):
    reply = _raw(layout, "q", b'{"op": "ping", "x": "' + b"a" * (10 << 20))
    assert reply["ok"] is False and "longer than" in reply["error"]
    _still_serving(q)


@pytest.mark.parametrize(("msg", "words"), [
    ({"colour": "blue"}, "colour"),
    ({"param1": 5}, "param1"),
    ({"due": ["tomorrow"]}, "due"),  # a string is read as RQ does ("tomorrow": 0)
    ({"max_count": 0}, "max_count"),
    ({"count": -1}, "count"),
    ({"force_remote": 1}, "force_remote"),  # a string is read as RQ does ("yes": true)
    ({"post_run_webhook": ["ftp://x"]}, "post_run_webhook"),
    ("not an object", "object"),
    ({"dest": "other"}, "is not queue q"),
    ({"dest": "../etc"}, "is not queue q"),
])
def test_bad_message_fields(layout, q, msg, words):
    with pytest.raises(BadRequest, match=words):
        q.call("create", msg=msg)
    assert q.call("counts")["counts"]["que"] == 0
    assert stray_temps(layout) == []
    _still_serving(q)


@pytest.mark.parametrize("args", [
    {"state": "done"}, {"state": 7}, {"attachments": "x"},
    {"attachments": [{"name": "a", "md5": "0" * 32}]},
])
def test_bad_create_arguments(layout, q, args):
    with pytest.raises(BadRequest):
        q.call("create", msg={}, **args)
    assert stray_temps(layout) == []
    _still_serving(q)


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "x" * 100, "a b"])
def test_bad_queue_names(layout, name):
    with pytest.raises(BadRequest, match="invalid queue name"):
        QueueClient(layout, name)


@pytest.mark.parametrize("msg_id", ["..", "../../etc/passwd", "20240101.0000.00.000/0",
                                    "20240101.0000.00.000.0/..", "", 17, None])
@pytest.mark.parametrize("op", ["get", "status", "state", "delete", "destroy", "commit",
                                "clone", "run_now"])
def test_bad_message_ids(layout, q, op, msg_id):
    with pytest.raises(BadRequest, match="invalid message id"):
        q.call(op, msg_id=msg_id)


@pytest.mark.parametrize("name", ["..", "../evil", "a/b", ".md5", "", "x" * 300])
def test_bad_attachment_names(layout, q, tmp_path, name):
    data = tmp_path / "f"
    data.write_bytes(b"x")
    md5 = hashlib.md5(b"x").hexdigest()
    msg_id = q.call("create", msg={}, state="prep")["msg_id"]
    with open(data, "rb") as f, q.client() as client:
        with pytest.raises(BadRequest, match="invalid attachment name"):
            client.call("attach", fds=[f.fileno()], msg_id=msg_id, name=name, md5=md5)
        with pytest.raises(BadRequest, match="invalid attachment name"):
            client.call("create", fds=[f.fileno()], msg={},
                        attachments=[{"name": name, "md5": md5}])
    assert q.call("get", msg_id=msg_id)["attachments"] == {}
    assert not (layout.root / "evil").exists()
    assert stray_temps(layout) == []
    _still_serving(q)


def test_ten_megabyte_status_line(layout, make_queue, daemon):
    make_queue("q", "{ printf 'run '; head -c 10000000 /dev/zero | tr '\\0' x; echo; } >&3\n"
               'echo "done survived" >&3')
    proc = daemon("q")
    msg_id = send(proc)
    assert settle(proc, msg_id)["status"] == "survived"
    assert proc.call("ping")["ok"] is True


def test_script_that_closes_fd3(layout, make_queue, daemon):
    make_queue("q", 'exec 3>&-\necho "still running"\nsleep 0.2\nexit 0')
    proc = daemon("q")
    msg_id = send(proc)
    reply = settle(proc, msg_id)
    assert reply["state"] == "err" and "without sending done" in reply["status"]
    assert job_file(proc.layout, "q", msg_id, "stdio.log").read_text() == "still running\n"


def test_script_leaving_a_background_child(layout, make_queue, daemon):
    # The child keeps fd 3 open, so EOF on the pipe never comes: the exit decides.
    make_queue("q", 'sleep 300 &\necho $! > bg.pid\necho "done left a child" >&3')
    proc = daemon("q")
    msg_id = send(proc)
    assert settle(proc, msg_id, timeout=5)["status"] == "left a child"
    pid = int(job_file(layout, "q", msg_id, "bg.pid").read_text())
    wait_for(lambda: not pid_alive(pid), what="background child killed with the group")


def test_script_writing_100_megabytes(layout, make_queue, daemon):
    make_queue("q", 'head -c 100000000 /dev/zero\necho "done wrote" >&3')
    proc = daemon("q")
    msg_id = send(proc)
    assert settle(proc, msg_id, timeout=30)["status"] == "wrote"
    assert os.stat(job_file(layout, "q", msg_id, "stdio.log")).st_size == 100_000_000
    store_of(layout, "q").delete(msg_id, "done")  # give the disk back
