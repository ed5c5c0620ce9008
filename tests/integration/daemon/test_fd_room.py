"""The queue daemon's fds: room for 128 workers whatever soft limit it inherits,
and out of them, clients wait and the daemon lives on."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

from conftest import DaemonProcess, wait_for

from rqsys.daemon.main import FD_SOFT
from rqsys.daemon.server import ACCEPT_PAUSE

INHERITED = 512  # below what 128 runs hold (six fds each, eight under journald)


def _soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no Max open files line")


def _settled_fds(pid: int) -> set[int] | None:
    """The daemon's open fds, if the same over half a second."""
    seen = [{int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}]
    for _ in range(5):
        time.sleep(0.1)
        seen.append({int(fd) for fd in os.listdir(f"/proc/{pid}/fd")})
    return seen[0] if all(fds == seen[0] for fds in seen) else None


def test_a_daemon_started_with_a_low_soft_limit_runs_128_scripts_at_once(
        layout, make_queue, tmp_path):
    gate = tmp_path / "gate"
    make_queue("q", f"while [ ! -e {gate} ]; do sleep 0.05; done\necho \"done $(ulimit -n)\" >&3\n",
               num_workers=128)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (INHERITED, hard))  # the daemon inherits it
    try:
        daemon = DaemonProcess(layout, "q")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    want = FD_SOFT if hard == resource.RLIM_INFINITY else min(FD_SOFT, hard)
    try:
        # Given a daemon whose shell gave it 512 fds: it took room for 128 runs
        assert _soft_limit(daemon.proc.pid) == want
        ids = [daemon.call("create", msg={})["msg_id"] for _ in range(128)]
        # When all 128 run at once
        wait_for(lambda: daemon.call("counts")["counts"]["run"] == 128, 60, "128 running")
        gate.touch()
        wait_for(lambda: daemon.call("counts")["counts"]["done"] == 128, 60, "128 done")
        # Then none failed to start, and the scripts have the daemon's limit
        statuses = {daemon.call("status", msg_id=i)["status"] for i in ids}
        assert statuses == {str(want)}, statuses
        assert "SCRIPTERROR" not in daemon.stderr_path.read_text()
    finally:
        gate.touch()
        daemon.stop()


def test_a_daemon_out_of_fds_lets_clients_wait_and_lives_on(layout, make_queue):
    make_queue("q", "echo done >&3\n")
    daemon = DaemonProcess(layout, "q")
    pid = daemon.proc.pid
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    try:
        # Given a daemon with every fd its limit allows in use: the limit is its
        # lowest free fd number (a new fd takes the lowest free number below it),
        # once its start-up's passing fds (the search index's walk) are closed
        in_use = wait_for(lambda: _settled_fds(pid), 20, "the daemon's fds to settle")
        lowest_free = min(set(range(len(in_use) + 1)) - in_use)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, hard))
        # When a client connects: it cannot be accepted
        answers: list[dict] = []
        asking = threading.Thread(target=lambda: answers.append(daemon.call("create", msg={})))
        asking.start()
        wait_for(lambda: "cannot take connections: Too many open files"
                 in daemon.stderr_path.read_text(), 10, "the warning")
        time.sleep(3 * ACCEPT_PAUSE)  # paused, tried again, paused: not spinning, not dead
        assert daemon.proc.poll() is None and not answers
        assert daemon.stderr_path.read_text().count("cannot take connections") == 1
        # Then fds free again: the waiting client is answered, and its message runs
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (FD_SOFT, hard))
        asking.join(10)
        assert answers and answers[0]["ok"]
        msg_id = answers[0]["msg_id"]
        wait_for(lambda: daemon.call("status", msg_id=msg_id)["state"] == "done", 10, "done")
        assert "connections taken again" in daemon.stderr_path.read_text()
    finally:
        daemon.stop()


def test_a_resent_run_ending_out_of_fds_ends_and_the_daemon_lives_on(layout, make_queue,
                                                                      tmp_path):
    gate = tmp_path / "gate"
    second = tmp_path / "second"
    make_queue("q", f"""[ "$RQ_COUNT" = 0 ] && {{ echo "resend 0-again" >&3; exit 0; }}
touch {second}
while [ ! -e {gate} ]; do sleep 0.05; done
echo "done at last" >&3
""")
    daemon = DaemonProcess(layout, "q")
    pid = daemon.proc.pid
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    try:
        # Given a message's second run (count 1), waiting, in a daemon out of fds
        # (one ended before: the hour's done/ shard is made, which takes an fd)
        gate.touch()
        first = daemon.call("create", msg={})["msg_id"]
        wait_for(lambda: daemon.call("status", msg_id=first)["state"] == "done", 10, "the first")
        gate.unlink()
        second.unlink()
        msg_id = daemon.call("create", msg={})["msg_id"]
        wait_for(second.exists, 10, "its second run")
        in_use = wait_for(lambda: _settled_fds(pid), 20, "the daemon's fds to settle")
        resource.prlimit(pid, resource.RLIMIT_NOFILE,
                         (min(set(range(len(in_use) + 1)) - in_use), hard))
        # When it ends: its count file cannot be opened (this ended the daemon,
        # the message left in run/ to run a third time)
        gate.touch()
        wait_for(lambda: "count not written: Too many open files"
                 in daemon.stderr_path.read_text(), 10, "the warning")
        # Then the daemon lives on, and the message ended as its script said
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (FD_SOFT, hard))
        assert daemon.proc.poll() is None
        wait_for(lambda: daemon.call("get", msg_id=msg_id)["state"] == "done", 10, "done")
        # (its status file could not be written either: the log has its last status)
        assert f"{msg_id}: done: at last" in daemon.stderr_path.read_text()
    finally:
        gate.touch()
        daemon.stop()
