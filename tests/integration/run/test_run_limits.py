"""Per-run limits in embedded mode (no systemd here): a real daemon, real
scripts, RLIMIT_AS for memory_max, the daemon's timer for runtime_max, and
the peak memory wait4 reports.  The systemd scopes are checked in a booted
container (tests/system/test_systemd_limits.py)."""

from __future__ import annotations

import pytest
from daemon_util import send, settle, store_of

from rqsys.errors import RQError
from rqsys.observe import timeline
from rqsys.run import scopes
from rqsys.run.limits import Run, explain
from rqsys.run.verdict import Outcome

ALLOCATE = """\
import os, sys
size = int(os.environ["RQ_PARAM1"]) << 20
try:
    data = b"x" * size  # every page written: resident
except MemoryError:
    print("cannot allocate", size, file=sys.stderr)
    sys.exit(3)
with open(3, "w") as status:
    status.write(f"done allocated {len(data)}\\n")
"""


def test_no_systemd_here():
    # the fallback is what these tests check; the host has no systemd as PID 1
    assert not scopes.available()


def test_rlimit_stops_a_runaway_allocation_with_a_clear_reason(layout, make_queue, daemon):
    # Given a queue whose runs may use 150M
    make_queue("q", ALLOCATE, shebang="#!/usr/bin/env python3",
               message_limits={"memory_max": "150M"})
    proc = daemon("q")
    # When one run allocates 400 MB and the next 20 MB
    big, small = send(proc, param1="400"), send(proc, param1="20")
    # Then the first ends in err saying the limit, and the queue goes on
    reply = settle(proc, big, timeout=30)
    assert reply["state"] == "err"
    assert "exit 3" in reply["status"]
    assert "(memory_max 150M is RLIMIT_AS here: an allocation past it fails)" in reply["status"]
    assert settle(proc, small, timeout=30)["state"] == "done"
    assert "runs are limited without systemd" in proc.stderr_text()


def test_runtime_max_kills_the_run_and_says_so(layout, make_queue, daemon):
    # Given a queue whose runs may take 60 s, and a message allowing only 0.5 s
    make_queue("q", 'echo "run sleeping" >&3; sleep 30; echo "done" >&3',
               message_limits={"runtime_max": 60})
    proc = daemon("q")
    msg_id = send(proc, limits={"runtime_max": 0.5, "memory_max": "8T"})
    # Then it is killed at its own (tighter) limit, with that reason
    reply = settle(proc, msg_id, timeout=20)
    assert (reply["state"], reply["status"]) == ("err", "killed: runtime limit 0.5 s")
    # And a message asking for more than the queue allows gets the queue's limit
    msg = proc.call("get", msg_id=msg_id)["msg"]
    assert msg["limits"] == {"runtime_max": 0.5, "memory_max": "8T"}


def test_peak_memory_of_a_run_is_recorded(layout, make_queue, daemon):
    # Given a queue with run limits, and a run allocating 200 MB
    make_queue("q", ALLOCATE, shebang="#!/usr/bin/env python3",
               message_limits={"memory_max": "1G"})
    proc = daemon("q")
    msg_id = send(proc, param1="200")
    assert settle(proc, msg_id, timeout=30)["state"] == "done"
    # Then its timeline's exit event says a peak within 10 % of that
    events = timeline.read(store_of(layout, "q").msg_dir("done", msg_id))
    [end] = [e for e in events if e["ev"] == "exit"]
    assert abs(end["maxrss_kb"] * 1024 - (200 << 20)) <= 0.1 * (200 << 20), end
    assert end["utime_s"] + end["stime_s"] > 0


def test_a_bad_message_limit_is_refused_naming_the_field(layout, make_queue, daemon):
    make_queue("q", 'echo "done" >&3')
    proc = daemon("q")
    with pytest.raises(RQError, match="limits/runtime_max"):
        proc.call("create", msg={"limits": {"runtime_max": -1}})


def test_explain_names_the_limit_that_ended_a_run():
    # the OOM killer cannot act in this machine's containers (cgroup v1,
    # read-only), so the scope's "oom-kill" result is given here by hand
    run = Run(worker=None, limits={"memory_max": "2G"})  # type: ignore[arg-type]
    killed = Outcome("err", "PROCESS EXITED IMPROPERLY ...", kind="signal")
    run.oom = True
    assert explain(run, killed) == Outcome("err", "killed: out of memory (limit 2G)",
                                           kind="signal")
    # a script that said err itself, a timeout, or a good end keep their own words
    for kept in (Outcome("err", "bad input", kind="err"), Outcome("done", "ok"),
                 Outcome("err", "killed: runtime limit 2 s", kind="timeout")):
        assert explain(run, kept) == kept


def test_the_daemons_own_cgroup_is_read_from_proc(tmp_path):
    from rqsys.run import cgroups

    # outside the cgroup namespace's root, or without a v2 line: none to delegate
    assert cgroups.own_cgroup("0::/..\n") is None
    assert cgroups.own_cgroup("4:memory:/x\n") is None
    found = cgroups.own_cgroup("9:name=systemd:/a\n0::/system.slice/rq@q.service\n")
    assert found is None or str(found).endswith("/system.slice/rq@q.service")
    # the files holding a run's limits, only for the controllers given
    delegation = cgroups.Delegation(tmp_path)
    delegation.controllers = {"memory", "pids"}
    assert delegation.limit_files({"memory_max": "1G", "cpu_quota": "50%", "tasks_max": 8}) \
        == {"memory.max": str(1 << 30), "pids.max": "8"}
    assert not delegation.holds("cpu_quota") and delegation.holds("runtime_max")


def test_a_sigkill_after_a_new_oom_kill_of_the_unit_is_the_queues_memory_max(tmp_path):
    # the real OOM killer at a queue's MemoryMax= is in tests/test_uml_limits.py;
    # here the unit's memory.events is a file, and each new kill explains one end
    from types import SimpleNamespace

    from rqsys.run.limits import RunLimits

    ctx = SimpleNamespace(name="q", config={"limits": {"memory_max": "128M"}})
    events = tmp_path / "memory.events"
    events.write_text("oom 2\noom_kill 2\n")  # before this daemon: not its runs'
    limits = RunLimits(ctx, None, None)  # type: ignore[arg-type]
    limits._unit, limits._oom_seen = tmp_path, 2
    killed = Outcome("err", "PROCESS EXITED IMPROPERLY ... SIGKILL (signal 9)", kind="signal")
    assert limits.queue_oom(killed) == killed
    events.write_text("oom 3\noom_kill 3\n")
    assert limits.queue_oom(killed) == Outcome(
        "err", "killed: out of memory (queue limit 128M)", kind="signal")
    assert limits.queue_oom(killed) == killed  # that kill is told already
    # an exit, or a queue without a memory_max, keep their words
    events.write_text("oom 4\noom_kill 4\n")
    assert limits.queue_oom(Outcome("err", "exit 1", kind="exit")).text == "exit 1"
    ctx.config = {}
    assert limits.queue_oom(killed) == killed


def test_a_unit_that_says_it_delegates_but_did_not_is_told_why(layout, make_queue):
    from conftest import DaemonProcess, wait_for

    # Given a daemon told its cgroup is delegated (rq-scan's drop-in says so)
    # on a host that delegated nothing to it
    make_queue("q", "echo done >&3\n")
    daemon = DaemonProcess(layout, "q", env={"RQ_CGROUP_DELEGATED": "1"})
    try:
        # Then its log says why it is not used, and which way runs are limited instead
        wait_for(lambda: "runs with limits get" in daemon.stderr_path.read_text(), 10, "the way")
        log = daemon.stderr_path.read_text()
        assert "delegated cgroup not found: " in log, log
        reason = log.split("delegated cgroup not found: ")[1].splitlines()[0]
        assert "cgroup" in reason and len(reason) > 20, reason
    finally:
        daemon.stop()
