"""Priorities through a real daemon: the order scripts start in under one worker."""

from __future__ import annotations

import random
import subprocess

import pytest
from conftest import wait_for
from daemon_util import RQ, send, settle

from rqsys.errors import BadRequest

RECORD = 'echo "$RQ_PARAM1" >> "$OUT"; echo done >&3'


def test_hundred_messages_run_in_priority_then_arrival_order(tmp_path, make_queue, daemon):
    # Given a paused one-worker queue whose script records the order it runs in
    out = tmp_path / "order.txt"
    make_queue("q", RECORD, num_workers=1, env_vars={"OUT": str(out)})
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    # When 100 messages of random priorities are created in random order
    rng = random.Random(16)
    priorities = [rng.randint(-3, 3) for _ in range(100)]
    for n, prio in enumerate(priorities):
        send(proc, param1=f"{prio}:{n}", priority=prio)
    proc.call("adminoper", oper="resume")
    # Then they run by priority, smaller first, and among equals in arrival order
    lines = wait_for(lambda: _lines(out, 100), 60, "100 runs")
    expected = [f"{p}:{n}" for n, p in sorted(enumerate(priorities), key=lambda t: (t[1], t[0]))]
    assert lines == expected


def _lines(path, count):
    lines = path.read_text().split() if path.exists() else []
    return lines if len(lines) >= count else None


def test_a_better_priority_not_yet_due_does_not_hold_back_a_due_one(make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    later = send(proc, priority=-100, due=2**31)
    now = send(proc, priority=100)
    assert settle(proc, now)["state"] == "done"
    assert proc.call("status", msg_id=later)["state"] == "que"


def test_bad_priority_is_refused(make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    for bad in (1.5, "high", 1001, -1001, True):
        with pytest.raises(BadRequest, match="priority"):
            send(proc, priority=bad)


@pytest.mark.parametrize(("option", "value"), [("--priority", "high"), ("--timeout", "soon"),
                                                ("--retry_max", "1.5")])
def test_rq_refuses_bad_job_options_naming_them(layout, option, value):
    proc = subprocess.run([*RQ, "--root", str(layout.root), "sendmesg", "--dest", "q",
                           option, value], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and f"argument {option}: invalid" in proc.stderr
