"""A bug in a request handler is the daemon's fault, not the client's: it is
answered as an InternalError, logged with its traceback, and the daemon
carries on (the next request on the same connection is answered).

The bug is injected through the daemon's documented hook for extra
operations (``QueueDaemon(extra_ops=...)``): the test runs a real daemon
from a small launcher that adds an op whose handler fails, so nothing in
the shipped code reads a fault switch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import stop_process, wait_for

LAUNCHER = textwrap.dedent("""
    import sys
    from rqsys.daemon.loop import QueueDaemon
    from rqsys.store import Layout

    def boom(request):
        return {"ok": True, "got": request.args["no such field"]}  # the bug: a KeyError

    SCHEMA = {"type": "object", "properties": {"op": {"type": "string"}},
              "additionalProperties": False}
    daemon = QueueDaemon(Layout.from_root(sys.argv[1]), sys.argv[2],
                         extra_ops={"boom": (boom, SCHEMA)})
    sys.exit(daemon.run())
""")


@pytest.fixture
def buggy(layout, make_queue, tmp_path):
    """A real daemon of queue q with the buggy op; yields its stderr file."""
    make_queue("q", 'echo "done $RQ_PARAM1" >&3')
    notify_path = tmp_path / "notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(15)
    stderr, launcher = tmp_path / "stderr", tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    env = {"NOTIFY_SOCKET": str(notify_path), "PATH": "/usr/bin:/bin"}
    with open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, str(launcher), str(layout.root), "q"],
                                env=env, stderr=err, start_new_session=True)
    try:
        assert b"READY=1" in notify.recv(4096)
        yield stderr
        assert stop_process(proc, 20, "the queue daemon") == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()


def test_a_handler_bug_is_an_internal_error_and_the_connection_goes_on(layout, buggy):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(layout.socket_path("q")))
        # When the buggy op, then two ordinary ones, are sent on one connection
        sock.sendall(b'{"op": "boom"}\n{"op": "ping"}\n'
                     b'{"op": "create", "msg": {"param1": "after"}}\n')
        lines = b""
        while lines.count(b"\n") < 3:
            chunk = sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            lines += chunk
    bug, ping, create = (json.loads(x) for x in lines.splitlines())
    # Then the bug is answered as the daemon's, not the client's fault
    assert bug["ok"] is False and bug["kind"] == "InternalError"
    assert bug["error"].startswith("internal error: KeyError in boom")
    # And the daemon carries on with the same connection
    assert ping["ok"] is True and ping["queue"] == "q"
    assert create["ok"] is True
    # And the operator finds the bug, with its traceback, in the daemon's log
    log = wait_for(lambda: (text := buggy.read_text()) and "Traceback" in text and text,
                   what="the traceback in the log")
    assert "q: err: internal error in boom: KeyError('no such field')" in log
    assert 'request.args["no such field"]' in log  # the failing line, for whoever fixes it


def test_the_extra_op_is_checked_against_its_schema_first(layout, buggy):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(layout.socket_path("q")))
        sock.sendall(b'{"op": "boom", "surprise": 1}\n')
        reply = json.loads(sock.makefile("rb").readline())
    assert reply["kind"] == "BadRequest" and "'surprise' was unexpected" in reply["error"]
    assert "internal error" not in buggy.read_text()  # the handler never ran
