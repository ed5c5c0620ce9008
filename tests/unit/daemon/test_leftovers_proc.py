"""The parsing under rqsys.run.leftovers: /proc's stat, environ and cgroup texts."""

from __future__ import annotations

import os

import pytest

from rqsys.run.procs import Stat, in_run_cgroup, msg_id_of, parse_stat, read_proc

# /proc/<pid>/stat of a `sleep 300` (52 fields; starttime is the 22nd)
SLEEP_STAT = (b"4242 (sleep) S 1 4240 4242 0 -1 4194560 102 0 0 0 0 0 0 0 20 0 1 0 "
              b"3602763 5705728 224 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 "
              b"0 0 0 0 0 0 0 0 0 0\n")


def test_stat_gives_pid_comm_state_parent_session_threads_and_start():
    assert parse_stat(SLEEP_STAT) == Stat(pid=4242, comm="sleep", state="S", ppid=1,
                                          pgrp=4240, session=4242, threads=1,
                                          starttime=3602763)


@pytest.mark.parametrize("comm", ["a b", "x) (y", ") Z 1 2 3", "(((", "ünï"])
def test_a_comm_with_spaces_and_parentheses_is_read_whole(comm):
    data = SLEEP_STAT.replace(b"(sleep)", f"({comm})".encode())
    stat = parse_stat(data)
    assert (stat.comm, stat.state, stat.session, stat.starttime) == (comm, "S", 4242, 3602763)


def test_a_zombie_and_a_thread_count():
    data = SLEEP_STAT.replace(b") S 1 ", b") Z 77 ").replace(b" 20 0 1 0 ", b" 20 0 9 0 ")
    stat = parse_stat(data)
    assert (stat.state, stat.ppid, stat.threads) == ("Z", 77, 9)


def test_this_process_stat_reads_as_itself():
    data = read_proc("/proc/self/stat")
    assert data is not None
    stat = parse_stat(data)
    assert (stat.pid, stat.ppid, stat.pgrp, stat.session) == (
        os.getpid(), os.getppid(), os.getpgid(0), os.getsid(0))


def test_a_gone_process_reads_as_none():
    assert read_proc("/proc/0/stat") is None


@pytest.mark.parametrize(("environ", "found"), [
    (b"PATH=/bin\0RQ_MSG_ID=20250101.0000.00.000.0\0HOME=/\0", "20250101.0000.00.000.0"),
    (b"RQ_MSG_ID=first\0", "first"),  # the first entry
    (b"A=1\0RQ_MSG_ID=last", "last"),  # no NUL after the last
    (b"RQ_MSG_ID=\0", ""),
    (b"RQ_MSG_ID=a=b\0", "a=b"),
    (b"RQ_MSG_ID=one\0RQ_MSG_ID=two\0", "one"),  # getenv's: the first
    (b"RQ_FULL_MSG_ID=http://h/q/a/1\0XRQ_MSG_ID=1\0RQ_MSG_ID_X=1\0", None),
    (b"", None),  # a zombie's, or a kernel thread's
    (b"RQ_MSG_ID=\xff\xfe\0", "\udcff\udcfe"),  # bytes kept as they are
])
def test_environ_gives_the_run_mark_or_none(environ, found):
    assert msg_id_of(environ) == found


@pytest.mark.parametrize(("cgroup", "inside"), [
    (b"0::/system.slice/rq@lim.service/msg-M1\n", True),  # its delegated sub-cgroup
    (b"0::/system.slice/rq-msg-q-M1.scope\n", True),  # its transient scope
    (b"1:name=systemd:/system.slice/rq-msg-q-M1.scope\n0::/\n", True),  # hybrid
    (b"0::/system.slice/rq@lim.service/daemon\n", False),  # the daemon's own
    (b"0::/system.slice/rq@lim.service/msg-M10\n", False),  # another run's
    (b"0::/system.slice/rq-msg-q-M2.scope\n", False),
    (b"0::/system.slice/rq-msg-other-M1.scope\n", False),  # another queue's
    (b"0::/\n", False),
    (b"", False),
])
def test_a_process_in_its_runs_cgroup_is_left_to_that_cgroups_stop(cgroup, inside):
    assert in_run_cgroup(cgroup, "q", "M1") is inside
