"""``rq wait``, ``rq tail -f``, ``rq run`` and ``rq ls`` against real daemons:
output, exit codes and stderr lines for done, err, and a message destroyed
while followed (the daemon pushes the end through ``watch``; output comes
through inotify)."""

from __future__ import annotations

import functools
import json
import os
import select
import subprocess
import sys
import time

import pytest
from conftest import wait_for
from daemon_util import send, settle, write_gate

from rqsys.errors import BadRequest

RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]
SCRIPT = """
echo "early $RQ_PARAM1"
if [ "$RQ_PARAM2" = gate ]; then
  while [ ! -e "$RQ_MSG_DIR/go" ]; do sleep 0.02; done
fi
echo "late $RQ_PARAM1"
[ -n "$RQ_PARAM3" ] && cat "$RQ_MSG_DIR/../attach/$RQ_PARAM3"
if [ "$RQ_PARAM1" = bad ]; then echo "err it broke" >&3; else echo "done fine" >&3; fi
"""


def rq(layout, *args, timeout=30):
    return subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=timeout)


def start_rq(layout, *args):
    return subprocess.Popen([*RQ, "--root", str(layout.root), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def read_line(proc, timeout=10.0):
    """The next stdout line of a running rq (fails at the deadline)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "rq printed nothing in time"
    return proc.stdout.readline()


def has_open(pid, name):
    """Whether process ``pid`` holds a file named ``name`` open."""
    fds = f"/proc/{pid}/fd"
    try:
        return any(os.readlink(f"{fds}/{fd}").endswith(name) for fd in os.listdir(fds))
    except FileNotFoundError:
        return False


def job_dir(layout, msg_id):
    return layout.queue_dir("q") / "run" / msg_id / "job"


@pytest.fixture
def q(make_queue, daemon):
    make_queue("q", SCRIPT)
    return daemon("q")


def test_wait_prints_a_line_each_and_fails_if_any_err(layout, q):
    good, bad = send(q, param1="ok"), send(q, param1="bad")
    done = rq(layout, "wait", good, bad)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith(f"/q/q/{good} done - fine")
    assert lines[1].endswith(f"/q/q/{bad} err - it broke")
    assert rq(layout, "wait", good).returncode == 0


def test_wait_blocks_until_the_end_is_pushed(layout, q):
    msg_id = send(q, param1="ok", param2="gate")
    waiting = start_rq(layout, "wait", msg_id)
    settle(q, msg_id, ("run",))
    time.sleep(0.2)  # not a wait for an event: proves rq wait did not return early
    assert waiting.poll() is None
    write_gate(job_dir(layout, msg_id) / "go")
    out, err = waiting.communicate(timeout=10)
    assert waiting.returncode == 0 and out.endswith(f"{msg_id} done - fine\n"), err


def test_tail_follows_output_to_the_end_and_exits_with_the_verdict(layout, q):
    msg_id = send(q, param1="bad", param2="gate")
    settle(q, msg_id, ("run",))
    tail = start_rq(layout, "tail", "-f", msg_id)
    assert read_line(tail) == "early bad\n"
    write_gate(job_dir(layout, msg_id) / "go")
    assert read_line(tail) == "late bad\n"
    out, err = tail.communicate(timeout=10)
    assert tail.returncode == 1 and out == ""
    assert err.startswith("rq: http") and err.endswith(f"/q/q/{msg_id} err - it broke\n")
    # and a tail of an ended message prints it all, and -f ends at once
    again = rq(layout, "tail", "-f", msg_id)
    assert again.stdout == "early bad\nlate bad\n" and again.returncode == 1


def test_tail_from_end_skips_what_was_written(layout, q):
    msg_id = send(q, param1="ok", param2="gate")
    settle(q, msg_id, ("run",))
    assert rq(layout, "tail", msg_id).stdout == "early ok\n"  # without -f: what there is
    tail = start_rq(layout, "tail", "-f", "--from-end", msg_id)
    wait_for(lambda: has_open(tail.pid, "stdio.log"), what="rq tail to open the log")
    write_gate(job_dir(layout, msg_id) / "go")
    out, err = tail.communicate(timeout=10)
    assert out == "late ok\n" and tail.returncode == 0, err


def test_tail_of_a_message_destroyed_while_followed(layout, q):
    msg_id = send(q, param1="ok", param2="gate")
    settle(q, msg_id, ("run",))
    tail = start_rq(layout, "tail", "-f", msg_id)
    assert read_line(tail) == "early ok\n"
    q.call("destroy", msg_id=msg_id)
    out, err = tail.communicate(timeout=10)
    assert tail.returncode == 1 and out == ""
    assert err.endswith(f"/q/q/{msg_id} gone - destroyed while running\n")


def test_run_sends_follows_and_exits_with_the_verdict(layout, q, tmp_path):
    attached = tmp_path / "notes.txt"
    attached.write_text("attached words\n")
    done = rq(layout, "run", "--dest", "q", "--param1", "ok", "--param3", "notes.txt",
              "--attach", str(attached))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "early ok\nlate ok\nattached words\n"
    assert done.stderr.startswith("rq: http") and done.stderr.endswith(" done - fine\n")
    failed = rq(layout, "run", "--dest", "q", "--param1", "bad")
    assert failed.returncode == 1 and failed.stderr.endswith(" err - it broke\n")


def test_ls_lists_with_times(layout, q):
    msg_id = send(q, param1="ok")
    settle(q, msg_id)
    rows = json.loads(rq(layout, "ls", "--queue", "q", "--state", "done", "--json").stdout)
    assert [r["msg_id"] for r in rows] == [msg_id]
    row = rows[0]
    assert row["created_at"] <= row["started_at"] <= row["ended_at"]
    assert row["status"] == "fine" and row["param1"] == "ok" and row["run_s"] >= 0
    text = rq(layout, "ls", "--queue", "q", "--state", "done", "--long").stdout.splitlines()
    assert len(text) == 1 and text[0].startswith(f"{msg_id} done 20")
    assert text[0].endswith(" fine")
    assert rq(layout, "ls", "--queue", "q", "--long").stdout == ""  # que is empty


def test_bad_input_is_refused_clearly(layout, q):
    bad_id = rq(layout, "wait", "not-an-id")
    assert bad_id.returncode == 1 and bad_id.stderr == "rq: invalid message id: 'not-an-id'\n"
    missing = rq(layout, "tail", "-f", "20250101.0000.00.000.0")
    assert missing.returncode == 1 and "no message 20250101.0000.00.000.0" in missing.stderr
    bad_state = rq(layout, "ls", "--queue", "q", "--state", "bogus", "--json")
    assert bad_state.returncode == 2 and "invalid choice: 'bogus'" in bad_state.stderr
    with pytest.raises(BadRequest, match="invalid message id"):
        q.client().call("watch", msg_id="../x")


def _watch_lines(layout, msg_id, then):
    """A watch of ``msg_id``: its first answer read (the daemon holds the
    watch from then on), ``then()`` called, and the lines up to its end."""
    from rqsys.wire.client import QueueClient
    from rqsys.wire.framing import LineBuffer

    sock = QueueClient(layout, "q", timeout=10).open_stream("watch", msg_id=msg_id)
    lines, buf = [], LineBuffer()
    try:
        while not lines or lines[-1].get("state") not in ("done", "err"):
            got = buf.next_line()
            if got is None:
                data = sock.recv(65536)
                assert data, f"the watch ended early: {lines}"
                buf.feed(data, [])
                continue
            lines.append(json.loads(got[0]))
            if len(lines) == 1:
                then()
    finally:
        sock.close()
    return lines


def test_a_watch_after_the_last_watch_ended_is_told_again(layout, q):
    # The daemon tells watchers only while it has one (its sink comes and goes)
    for n in range(2):
        msg_id = send(q, param1="ok", param2="gate")
        settle(q, msg_id, ("run",))
        gate = job_dir(layout, msg_id) / "go"
        lines = _watch_lines(layout, msg_id, functools.partial(write_gate, gate))
        assert lines[0]["state"] == "run", n
        assert any(line.get("event") == "exit" for line in lines), lines
        assert lines[-1]["state"] == "done" and lines[-1]["status"] == "fine", lines
