"""A queue daemon and its fork server (rqsys.run.forkserver, RQ_FORK_SERVER=on):
started at the first start, killed mid-drain without a message lost or run
twice; by default (auto) used only while messages wait for a worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from conftest import wait_for
from daemon_util import send, settle

SCRIPT = 'echo "$RQ_MSG_ID" >> "$MARKS"; echo done >&3'
ON = {"RQ_FORK_SERVER": "on"}


def _servers(daemon_pid: int) -> list[int]:
    """The daemon's live children named rqspawnd, oldest first: the server,
    then any child it is starting (named so until its exec)."""
    found = []
    for word in Path(f"/proc/{daemon_pid}/task/{daemon_pid}/children").read_text().split():
        try:
            comm, rest = Path(f"/proc/{word}/stat").read_text().rsplit(") ", 1)
        except OSError:
            continue  # ended meanwhile
        fields = rest.split()
        if comm.endswith("(rqspawnd") and fields[0] != "Z":
            found.append((int(fields[19]), int(word)))  # starttime, pid
    return [pid for _start, pid in sorted(found)]


def test_the_server_starts_with_the_first_script_and_its_scripts_are_the_daemons(
        make_queue, daemon, tmp_path):
    marks = tmp_path / "marks"
    make_queue("q", SCRIPT, env_vars={"MARKS": str(marks)})
    proc = daemon("q", env=ON)
    # Given a daemon that has run nothing: no fork server yet
    assert _servers(proc.proc.pid) == []
    # When a message runs, Then a server runs beside the daemon
    msg_id = send(proc)
    assert settle(proc, msg_id)["state"] == "done"
    assert len(_servers(proc.proc.pid)) == 1
    assert marks.read_text().split() == [msg_id]
    # and the daemon names its script's pid, its own child's
    assert f"{msg_id}: started: pid" in proc.stderr_text()


def test_a_server_killed_mid_drain_loses_nothing_and_runs_nothing_twice(
        make_queue, daemon, tmp_path):
    # Given 300 messages draining through 4 workers
    marks = tmp_path / "marks"
    make_queue("q", SCRIPT, num_workers=4, env_vars={"MARKS": str(marks)})
    proc = daemon("q", env=ON)
    proc.call("adminoper", oper="pause")
    ids = [send(proc) for _ in range(300)]
    proc.call("adminoper", oper="up")
    # When its fork server is killed three times while starts are in flight
    killed = []
    for _ in range(3):
        server = wait_for(lambda: next((p for p in _servers(proc.proc.pid)
                                        if p not in killed), None), 10, "a fork server")
        os.kill(server, signal.SIGKILL)
        killed.append(server)
        time.sleep(0.1)
    # Then every message ends done, each script having run exactly once
    for msg_id in ids:
        assert settle(proc, msg_id, timeout=60)["state"] == "done"
    assert sorted(marks.read_text().split()) == sorted(ids)
    # and each death was said, and a new server started
    said = proc.stderr_text()
    assert all(f"the fork server (pid {pid}) died with" in said for pid in killed), said
    assert proc.proc.poll() is None


def test_by_default_scripts_start_in_process_while_no_message_waits_for_a_worker(
        make_queue, daemon, tmp_path):
    # Given a daemon of 4 workers with its default RQ_FORK_SERVER (auto)
    marks = tmp_path / "marks"
    make_queue("q", SCRIPT, num_workers=4, env_vars={"MARKS": str(marks)})
    proc = daemon("q")
    # When messages come one at a time, each started before the next comes
    ids = []
    for _ in range(5):
        ids.append(send(proc))
        assert settle(proc, ids[-1])["state"] == "done"
    # Then no fork server was started: each start was made in process
    assert _servers(proc.proc.pid) == []
    assert sorted(marks.read_text().split()) == sorted(ids)


def _drained(make_queue, daemon, tmp_path, workers: int, count: int) -> int:
    """A paused daemon of ``workers`` (its default RQ_FORK_SERVER) given
    ``count`` messages, let go: each ends done, its script run once; its pid."""
    marks = tmp_path / "marks"
    make_queue("q", SCRIPT, num_workers=workers, env_vars={"MARKS": str(marks)})
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    ids = [send(proc) for _ in range(count)]
    proc.call("adminoper", oper="up")  # more are due than workers are free
    for msg_id in ids:
        assert settle(proc, msg_id, timeout=60)["state"] == "done"
    assert sorted(marks.read_text().split()) == sorted(ids)
    return proc.proc.pid


def test_by_default_a_backlog_is_started_through_the_fork_server_each_message_once(
        make_queue, daemon, tmp_path):
    # Given 60 messages let go on 4 workers: the fork server started them
    # (it runs beside the daemon now), each once
    assert len(_servers(_drained(make_queue, daemon, tmp_path, 4, 60))) == 1


def test_a_queue_of_two_workers_never_starts_a_fork_server_by_default(make_queue, daemon,
                                                                       tmp_path):
    assert _servers(_drained(make_queue, daemon, tmp_path, 2, 20)) == []


def test_a_retried_message_started_by_the_server_keeps_every_timeline_line(make_queue,
                                                                          daemon):
    # Given a message that failed, retried: its retried line and its new start
    # come in one turn, and the start's answer in a later one
    make_queue("q", "exit 1")
    proc = daemon("q", env=ON)
    msg_id = send(proc)
    assert settle(proc, msg_id)["state"] == "err"
    proc.call("retry", msg_id=msg_id)
    wait_for(lambda: proc.stderr_text().count(f"{msg_id}: err:") == 2, 10, "it failed again")
    # Then its timeline holds both runs and the retry between them
    kinds = [event["ev"] for event in proc.call("get", msg_id=msg_id)["timeline"]]
    assert kinds.count("started") == 2 and "retried" in kinds, kinds
    assert kinds.index("retried") < len(kinds) - 1 - kinds[::-1].index("started")


def test_an_rq_fork_server_value_not_on_off_or_auto_is_said_and_taken_as_off(
        make_queue, daemon, tmp_path):
    # Given a daemon whose environment says RQ_FORK_SERVER=yes (not a value it knows)
    marks = tmp_path / "marks"
    make_queue("q", SCRIPT, env_vars={"MARKS": str(marks)})
    proc = daemon("q", env={"RQ_FORK_SERVER": "yes"})
    # Then it says so at its start
    said = "RQ_FORK_SERVER='yes' is neither on, off nor auto: scripts start in process"
    wait_for(lambda: said in proc.stderr_text(), 10, "the warning")
    # and runs its messages, each once, with no fork server
    ids = [send(proc) for _ in range(3)]
    for msg_id in ids:
        assert settle(proc, msg_id)["state"] == "done"
    assert _servers(proc.proc.pid) == []
    assert sorted(marks.read_text().split()) == sorted(ids)
