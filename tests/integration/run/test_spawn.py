"""The cffi spawn helper, directly: exec failures, argv with exec_prefix, exit texts."""

from __future__ import annotations

import os
import signal

import pytest

from rqsys.errors import SpawnError
from rqsys.fdclose import close_fds
from rqsys.run.spawn import describe_exit, script_argv, spawn


def test_exec_failure_is_reported_not_forked_away(tmp_path):
    script = tmp_path / "bad"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    out = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(SpawnError, match="No such file or directory"):
            spawn([str(script)], str(script), {}, tmp_path, out)
        with pytest.raises(SpawnError, match="cannot execute"):
            spawn(["x"], str(tmp_path / "missing"), {}, tmp_path, out)
    finally:
        os.close(out)


def test_child_gets_env_cwd_and_new_session(tmp_path):
    out = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        child = spawn(["/bin/sh", "-c", 'echo "$A $(pwd)"; echo "done" >&3'], "/bin/sh",
                      {"A": "from-env"}, tmp_path, out)
    finally:
        os.close(out)
    _pid, status = os.waitpid(child.pid, 0)
    os.set_blocking(child.status_r, True)
    assert os.read(child.status_r, 100) == b"done\n"
    close_fds(child.release())
    assert status == 0
    assert (tmp_path / "log").read_text() == f"from-env {tmp_path}\n"


def test_script_argv(tmp_path):
    script = tmp_path / "run"
    script.write_text("#!/bin/sh\n")
    link = tmp_path / "link"
    link.symlink_to(script)
    with pytest.raises(SpawnError, match="missing or not executable"):
        script_argv(str(link), "")
    script.chmod(0o755)
    assert script_argv(str(link), "") == (str(script), [str(script)])
    program, argv = script_argv(str(link), "env X=1")
    assert program.endswith("/env") and argv == ["env", "X=1", str(script)]
    with pytest.raises(SpawnError, match="not found"):
        script_argv(str(link), "no-such-program-here -x")


def test_describe_exit():
    assert describe_exit(0) == "exit status 0"
    assert describe_exit(3 << 8) == "exit status 3"
    assert describe_exit(signal.SIGTERM) == "terminated by SIGTERM"
    assert describe_exit(signal.SIGSEGV | 0x80) == "terminated by SIGSEGV (core dumped)"


def test_child_makes_a_missing_job_dir_and_opens_stdio_log_there(tmp_path):
    job = tmp_path / "job"
    child = spawn(["/bin/sh", "-c", 'echo out; echo err >&2; echo "done" >&3'], "/bin/sh",
                  {}, job, None)
    _pid, status = os.waitpid(child.pid, 0)
    assert os.read(child.status_r, 100) == b"done\n"
    close_fds(child.release())
    assert status == 0
    assert (job / "stdio.log").read_text() == "out\nerr\n"


GLIBC_SIGNALS = 3 << 31  # bits of signals 32 and 33


def test_child_resets_the_signals_the_daemon_set_and_only_those(tmp_path):
    """With the helper told which signals are not at their default, the
    script still starts with none ignored or caught and none blocked."""
    from rqsys.run.spawn import reset_only_changed_signals

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGPIPE, signal.SIGUSR2)}
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        reset_only_changed_signals()
        child = spawn(["/bin/sh", "-c", "exec cat /proc/self/status >&3"],  # cat sets none
                      "/bin/sh", {}, tmp_path, None)
        _pid, status = os.waitpid(child.pid, 0)
        seen = os.read(child.status_r, 65536).decode()
        close_fds(child.release())
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        reset_only_changed_signals()
    assert status == 0
    # glibc keeps signals 32 and 33 to itself (its sigaction refuses them, and
    # its own posix_spawn leaves them ignored in the child): an earlier test
    # of the session may have left them ignored, which no script can see
    masks = {line.split(":")[0]: int(line.split()[1], 16) & ~GLIBC_SIGNALS
             for line in seen.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt"))}
    assert masks == {"SigBlk": 0, "SigIgn": 0, "SigCgt": 0}, seen


def test_the_scripts_pipe_ends_are_closed_here_or_held_until_the_run_ends(tmp_path):
    before = set(os.listdir("/proc/self/fd"))
    argv = ["/bin/sh", "-c", "echo done >&3"]
    # Given a start that closes the script's ends itself: its status pipe
    # reads to end of file once the script has ended
    child = spawn(argv, "/bin/sh", {}, tmp_path, None)
    os.waitpid(child.pid, 0)
    os.set_blocking(child.status_r, True)
    assert os.read(child.status_r, 100) == b"done\n" and os.read(child.status_r, 100) == b""
    close_fds(child.release())
    # When a start holds them (the daemon's, closed with the run's other fds)
    child = spawn(argv, "/bin/sh", {}, tmp_path, None, hold=True)
    os.waitpid(child.pid, 0)
    # Then no end of file while they are held, and the run's release has them
    assert len(child.held) == 2
    assert os.read(child.status_r, 100) == b"done\n"
    with pytest.raises(BlockingIOError):
        os.read(child.status_r, 100)
    fds = child.release()
    assert len(fds) == 5 and set(child.held) <= set(fds)
    close_fds(fds)
    assert child.release() == []  # released once
    # and nothing is left open either way
    assert set(os.listdir("/proc/self/fd")) == before
