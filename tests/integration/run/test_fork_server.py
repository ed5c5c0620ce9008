"""The fork server (rqsys.run.forkserver) driven as the daemon drives it: a real
rqspawnd, a selector, real scripts; this test's process plays the daemon."""

from __future__ import annotations

import errno
import json
import os
import select
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from conftest import wait_for

from rqsys.fdclose import close_fds
from rqsys.observe.events import EventLog
from rqsys.run.forkserver import REQUEST_MAX, ForkServer
from rqsys.run.leftovers import Leftovers
from rqsys.run.procs import stat_of
from rqsys.run.spawn import Child, spawn

PYTHON = "/usr/bin/python3"
GLIBC_SIGNALS = 3 << 31  # bits of signals 32 and 33
# the script's signal masks, as grep (which sets none) inherits them; then the
# probe (Python ignores SIGPIPE and SIGXFSZ itself)
SIGNALS = 'grep -E "^Sig(Ign|Blk)" /proc/self/status; exec "$0" -c "$1"'
PROBE = textwrap.dedent("""
    import json, os, resource
    fds = []
    for fd in range(64):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            pass
    print(json.dumps({"ppid": os.getppid(), "pid": os.getpid(), "sid": os.getsid(0),
                      "pgid": os.getpgid(0), "fds": fds, "cwd": os.getcwd(),
                      "stdin": os.readlink("/proc/self/fd/0"), "env": dict(os.environ),
                      "as": resource.getrlimit(resource.RLIMIT_AS)[0]}))
    os.write(3, b"done\\n")
""")


class Daemon:
    """A selector loop around one ForkServer, as the queue daemon's."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.warned: list[str] = []
        self.server = ForkServer(self.selector, os.close, self.warned.append)
        assert self.server.start()

    def close(self) -> None:
        """Close the server's socket: it exits, and is reaped here."""
        pid = self.server.pid
        self.server.close()
        assert os.waitpid(pid, 0)[1] == 0

    def begin(self, argv: list[str], cwd: Path, env: dict[str, str], out: int | None = None,
              as_limit: int = -1) -> tuple[Child | None, list[int]]:
        answers: list[int] = []
        blob = b"".join(f"{k}={v}\0".encode() for k, v in env.items())
        child = self.server.begin(argv[0], argv, blob, len(env), str(cwd),
                                  None if out is None else os.dup(out), as_limit, None,
                                  answers.append, self._again(argv, cwd, env, out))
        return child, answers

    @staticmethod
    def _again(argv: list[str], cwd: Path, env: dict[str, str],
               out: int | None) -> Callable[[], Child]:
        return lambda: spawn(argv, argv[0], env, cwd, out, os.getpid(), hold=True)

    def turn_until(self, done: Callable[[], bool], seconds: float = 20) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, "the loop waited too long"
            for key, mask in self.selector.select(0.05):
                key.data(key, mask)


def _children() -> set[int]:
    return {int(pid) for pid in Path(f"/proc/self/task/{os.getpid()}/children")
            .read_text().split()}




def test_a_script_it_starts_is_the_daemons_child_set_up_as_the_helper_sets_it(tmp_path):
    # Given a fork server (this process ignores SIGPIPE, as Python does)
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    daemon = Daemon()
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o644)
    # When it starts a probe in a job/ directory that does not exist yet
    child, answers = daemon.begin(["/bin/sh", "-c", SIGNALS, PYTHON, PROBE], tmp_path / "job",
                                  {"A": "from env"}, out, as_limit=1 << 32)
    os.close(out)
    assert child is not None and child.pid == 0  # pending until the answer
    daemon.turn_until(lambda: bool(answers))
    daemon.close()  # the server exits; the script runs on
    # Then it started, as this process's own child, which reaps it
    assert answers == [0] and child.pid > 0
    assert os.waitpid(child.pid, 0)[1] == 0
    os.set_blocking(child.status_r, True)
    assert os.read(child.status_r, 100) == b"done\n"
    *masks, probe = (tmp_path / "out").read_text().splitlines()
    got = json.loads(probe)
    close_fds(child.release())
    assert got["ppid"] == os.getpid() and got["pid"] == child.pid
    # with fds 0-4 only, a session of its own, stdin from /dev/null
    assert got["fds"] == [0, 1, 2, 3, 4]
    assert got["sid"] == got["pgid"] == got["pid"]
    assert got["stdin"] == "/dev/null"
    # no signal ignored (SIGPIPE reset) or blocked, its memory limit and environment
    # (glibc keeps signals 32 and 33 to itself: see test_spawn)
    assert [int(line.split()[1], 16) & ~GLIBC_SIGNALS for line in masks] == [0, 0], masks
    assert got["as"] == 1 << 32
    added = {"PWD", "LC_CTYPE"}  # by sh and by Python's locale coercion
    assert {k: v for k, v in got["env"].items() if k not in added} == {"A": "from env"}
    assert got["cwd"] == str(tmp_path / "job")


def test_an_exec_that_fails_is_answered_with_its_errno_and_the_child_reaped(tmp_path):
    daemon = Daemon()
    script = tmp_path / "bad"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    child, answers = daemon.begin([str(script)], tmp_path, {})
    assert child is not None
    daemon.turn_until(lambda: bool(answers))
    assert answers == [errno.ENOENT]
    # the failed child is reaped by the loop, not left a zombie
    daemon.turn_until(lambda: _children() == {daemon.server.pid})
    daemon.close()
    assert _children() == set()


def test_a_start_too_large_for_a_request_is_left_to_the_in_process_helper(tmp_path):
    daemon = Daemon()
    before = sorted(os.listdir("/proc/self/fd"))
    child, answers = daemon.begin(["/bin/true"], tmp_path, {"BIG": "x" * REQUEST_MAX})
    assert child is None and answers == []
    assert sorted(os.listdir("/proc/self/fd")) == before  # no pipe left open
    daemon.close()


def test_a_killed_server_starts_nothing_twice_and_loses_nothing(tmp_path):
    # Given starts in flight, each script appending its number to a log
    daemon = Daemon()
    log = tmp_path / "log"
    started: dict[int, tuple[Child, list[int]]] = {}
    for round_ in range(4):
        for n in range(round_ * 30, round_ * 30 + 30):
            child, answers = daemon.begin(["/bin/sh", "-c", f'echo {n} >> "{log}"'], tmp_path,
                                          {})
            assert child is not None
            started[n] = (child, answers)
        # When the server is killed with some of them not answered
        os.kill(daemon.server.pid, signal.SIGKILL)
        daemon.turn_until(lambda: all(answers for _child, answers in started.values()))
    # Then every start was settled as started, by the server or again in process
    assert all(answers == [0] for _child, answers in started.values())
    for child, _answers in started.values():
        assert os.waitpid(child.pid, 0)[1] == 0
        close_fds(child.release())
    # and each script ran exactly once
    assert sorted(map(int, log.read_text().split())) == list(range(120))
    assert daemon.server.restarts == 4
    assert all("died with" in text for text in daemon.warned)
    daemon.close()


HELPER = textwrap.dedent("""
    import os, selectors, sys, time
    sys.path.insert(0, sys.argv[1])
    from rqsys.run.forkserver import ForkServer
    selector = selectors.DefaultSelector()
    server = ForkServer(selector, os.close, print)
    server.start()
    answers = []
    script = 'trap "echo term > term; exit 0" TERM; : > started; while :; do sleep 0.05; done'
    server.begin("/bin/sh", ["/bin/sh", "-c", script], b"", 0, sys.argv[2], None, -1, None,
                 answers.append, None)
    while not answers:
        for key, mask in selector.select(1):
            key.data(key, mask)
    print(answers[0], flush=True)
    time.sleep(600)
""")


def test_the_script_dies_with_the_daemon_not_with_the_server(tmp_path):
    # Given a script a daemon started through its fork server
    root = str(Path(__file__).resolve().parents[3])
    helper = subprocess.Popen([sys.executable, "-c", HELPER, root, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert helper.stdout is not None and helper.stdout.readline().strip() == "0"
        wait_for(lambda: (tmp_path / "started").exists(), 10, "the script running")
        kids = Path(f"/proc/{helper.pid}/task/{helper.pid}/children").read_text().split()
        server = next(int(p) for p in kids
                      if Path(f"/proc/{p}/comm").read_text().strip() == "rqspawnd")
        # When the server is killed, the script goes on
        os.kill(server, signal.SIGKILL)
        time.sleep(0.5)
        assert not (tmp_path / "term").exists()
        # When the daemon is killed, the script is told TERM (its parent-death signal)
        helper.kill()
        helper.wait(10)
        wait_for(lambda: (tmp_path / "term").exists(), 10, "the script told TERM")
    finally:
        helper.kill()
        helper.wait(10)


def test_a_script_reaped_by_another_before_its_answer_is_read_ends_on_its_lines(tmp_path):
    # Given a start whose script has ended, its answer not read yet
    daemon = Daemon()
    before = _children()  # the server, and what earlier tests' children left
    child, answers = daemon.begin(["/bin/sh", "-c", "echo 'done fine' >&3"], tmp_path, {})
    assert child is not None
    wait_for(lambda: _children() - before)
    (pid,) = _children() - before
    # When another reaps it first (as a sweep of the daemon's zombie children may)
    assert os.waitpid(pid, 0)[0] == pid
    daemon.turn_until(lambda: bool(answers))
    # Then the start is answered all the same, not a crash: it reads as ended at
    # once, its wait status lost, said once
    assert answers == [0] and child.pid == pid and child.status_lost
    assert select.select([child.pidfd], [], [], 0)[0] == [child.pidfd]
    assert child.wait() == (pid, 0, None)
    assert any("its exit status is lost" in line for line in daemon.warned)
    # and its end is what its lines say (a script that said nothing: err)
    os.set_blocking(child.status_r, True)
    assert os.read(child.status_r, 100) == b"done fine\n"
    close_fds(child.release())
    daemon.close()


def test_the_leftovers_sweep_leaves_a_script_listed_before_the_page_names_it(tmp_path):
    # Given a script the server started and that has ended, its answer not
    # read, seen by the sweep in the kernel's moment between listing a new
    # child and writing its pid in the page (the page read as 0, once)
    daemon = Daemon()
    before = _children()
    child, answers = daemon.begin(["/bin/sh", "-c", "echo done >&3"], tmp_path, {})
    assert child is not None
    wait_for(lambda: _children() - before)
    (pid,) = _children() - before
    wait_for(lambda: (stat := stat_of(pid)) is not None and stat.state == "Z")
    asked: list[list[int]] = []

    def starting(unknown: list[int]) -> set[int]:
        asked.append(unknown)
        return {daemon.server.pid} if len(asked) == 1 else daemon.server.children(unknown)

    ctx = SimpleNamespace(name="q", config={"stop_grace": 1})
    leftovers = Leftovers(ctx, daemon.selector, EventLog("q", journal=False),  # type: ignore[arg-type]
                          lambda _s, _f: None, lambda: [(child.pid, "m")] if answers else [],
                          starting)
    leftovers._children = os.open(f"/proc/self/task/{os.getpid()}/children", os.O_RDONLY)
    # When another run's end sweeps the daemon's children
    leftovers.run_ended(1, "another")
    # Then the script is asked about again, not reaped: its start is answered
    # with its own wait status
    assert [pid] in asked[1:]
    assert (stat := stat_of(pid)) is not None and stat.state == "Z"
    daemon.turn_until(lambda: bool(answers))
    assert answers == [0] and not child.status_lost and not daemon.warned
    assert child.wait()[:2] == (pid, 0)
    close_fds(child.release())
    os.close(leftovers._children)
    daemon.close()
