"""Nothing outlives its message (rqsys.run.leftovers): what a script leaves
behind, out of its process group (setsid, double forks, a daemon's), is ended
when its run ends, and reaped; a running neighbour's processes are left alone.

Real processes throughout: each script notes the pid and start time of what
it leaves (``note``), and a process is gone when ``/proc/<pid>`` is absent
(not even a zombie) or names a newer process."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from daemon_util import send, settle

SCRIPT = r"""
note() {  # note NAME PID: once it runs its own program (set up: out of the
    # script's group, its trap set), its pid and start time, for the test
    local name=$1 pid=$2 s
    while case $(cat "/proc/$pid/comm") in bash|sh|setsid) true ;; *) false ;; esac; do
        sleep 0.01
    done
    s=$(cat "/proc/$pid/stat") || return 1
    s=${s##*) }
    set -- $s
    echo "$pid ${20}" > "$MARKS/$RQ_MSG_ID.$name.tmp"
    mv "$MARKS/$RQ_MSG_ID.$name.tmp" "$MARKS/$RQ_MSG_ID.$name"
}
told() {  # told FILE: wait for a leftover to write its pid, then the pid
    while [ ! -s "$1" ]; do sleep 0.01; done
    cat "$1"
}
T="$MARKS/$RQ_MSG_ID"
case "$RQ_PARAM1" in
many)
    setsid sleep 300 &
    note setsid $!
    ( ( sleep 300 & echo $! > "$T.p-double" ) & )
    note double "$(told "$T.p-double")"
    setsid -f sh -c 'echo $$ > "$1"; exec sleep 300' sh "$T.p-setsidf"
    note setsidf "$(told "$T.p-setsidf")"
    "$PY" -c "$DAEMONIZE" "$T.p-daemon"
    note daemon "$(told "$T.p-daemon")"
    env -i "$PY" -c "$OWN_GROUP" "$T.p-session" &
    note session "$(told "$T.p-session")"
    echo "done left five behind" >&3 ;;
stubborn)
    setsid sh -c "trap '' TERM; exec sleep 300" &
    note stubborn $!
    echo "done left a stubborn one" >&3 ;;
stay)
    setsid sleep 300 &
    note setsid $!
    ( env -i "$PY" -c "$OWN_GROUP" "$T.p-session" & )
    note session "$(told "$T.p-session")"
    ( sleep 0.3 & echo $! > "$T.p-zombie" )
    note zombie "$(told "$T.p-zombie")"
    echo "run waiting" >&3
    while [ ! -e "$MARKS/go" ]; do sleep 0.02; done
    echo "done stayed" >&3 ;;
esac
"""
# a daemon's double fork, setsid between: the grandchild keeps the environment
DAEMONIZE = """import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(300)
"""
# out of the script's process group, environment cleared: only its session marks it
OWN_GROUP = """import os, sys, time
os.setpgid(0, 0)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(300)
"""
MANY = ("setsid", "double", "setsidf", "daemon", "session")


@pytest.fixture
def marks(tmp_path: Path):
    """The directory the scripts note their leftovers in; any still there at
    the end is killed (a failing test leaves no sleeper behind)."""
    where = tmp_path / "marks"
    where.mkdir()
    yield where
    for noted in where.glob("*.*"):
        if noted.suffix == ".tmp" or noted.suffix.startswith(".p-"):
            continue  # half written, or a leftover's own word
        pid, start = _noted(noted)
        if not _gone(pid, start):
            os.kill(pid, signal.SIGKILL)


def _queue(make_queue, marks: Path, **cfg) -> None:
    make_queue("q", SCRIPT, env_vars={"MARKS": str(marks), "PY": sys.executable,
                                      "DAEMONIZE": DAEMONIZE, "OWN_GROUP": OWN_GROUP}, **cfg)


def _noted(path: Path) -> tuple[int, int]:
    pid, start = path.read_text().split()
    return int(pid), int(start)


def left(marks: Path, msg_id: str, name: str) -> tuple[int, int]:
    return _noted(marks / f"{msg_id}.{name}")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _gone(pid: int, start: int) -> bool:
    """Not alive, not a zombie: /proc/<pid> is absent (or is a newer process's)."""
    fields = _stat(pid)
    return fields is None or int(fields[19]) != start


def _zombie(pid: int, start: int) -> bool:
    fields = _stat(pid)
    return fields is not None and int(fields[19]) == start and fields[0] == "Z"


def wait_gone(marks: Path, msg_id: str, names: tuple[str, ...]) -> None:
    noted = {name: left(marks, msg_id, name) for name in names}
    wait_for(lambda: all(_gone(*p) for p in noted.values()), 10,
             f"{', '.join(names)} gone: {noted}")


def test_what_a_run_leaves_behind_is_gone_when_its_message_is_done(make_queue, daemon, marks):
    # Given a script that leaves five processes behind, out of its process
    # group: setsid, a plain double fork, setsid -f, a daemon's double fork
    # with setsid, and one in its session with no environment
    _queue(make_queue, marks)
    proc = daemon("q")
    # When its message is done
    msg_id = send(proc, param1="many")
    assert settle(proc, msg_id)["state"] == "done"
    # Then none of them is left, not even a zombie
    wait_gone(marks, msg_id, MANY)
    # And the log said which it ended, once
    lines = [x for x in proc.stderr_text().splitlines() if "the run left behind" in x]
    assert len(lines) == 1, lines
    assert f"{msg_id}: script: ended " in lines[0]
    pid, _start = left(marks, msg_id, "setsid")
    assert f"pid {pid} (sleep)" in lines[0]


def test_a_leftover_that_ignores_term_is_killed_after_stop_grace(make_queue, daemon, marks):
    # Given a script that leaves a process ignoring SIGTERM, and stop_grace 2 s
    _queue(make_queue, marks, stop_grace=2)
    proc = daemon("q")
    # When its message is done
    msg_id = send(proc, param1="stubborn")
    assert settle(proc, msg_id)["state"] == "done"
    # Then the leftover outlives the TERM, for stop_grace, and is killed then
    pid, start = left(marks, msg_id, "stubborn")
    assert not _gone(pid, start) and not _zombie(pid, start)
    wait_gone(marks, msg_id, ("stubborn",))
    log = proc.stderr_text()
    assert f"ended 1 process the run left behind: pid {pid} (sleep)" in log
    assert (f"killed 1 process the run left behind, still there after stop_grace (2 s): "
            f"pid {pid} (sleep)") in log


def test_a_running_neighbours_processes_are_left_alone(make_queue, daemon, marks):
    # Given a run that goes on, whose orphans (a setsid one, one in its session
    # with no environment) are the daemon's children now, and one of them
    # has exited: a zombie of the daemon
    _queue(make_queue, marks, num_workers=2)
    proc = daemon("q")
    stay = send(proc, param1="stay")
    wait_for(lambda: proc.call("status", msg_id=stay)["status"] == "waiting", what="stay runs")
    zombie = left(marks, stay, "zombie")
    wait_for(lambda: _zombie(*zombie), 10, "the exited orphan a zombie of the daemon")
    # When a neighbour's run ends, leaving processes behind
    other = send(proc, param1="many")
    assert settle(proc, other)["state"] == "done"
    wait_gone(marks, other, MANY)
    # Then the running message's processes are untouched, and the zombie reaped
    for name in ("setsid", "session"):
        assert not _gone(*left(marks, stay, name)), name
    assert _gone(*zombie)
    assert proc.call("status", msg_id=stay)["state"] == "run"
    # And once it ends too, its own are gone
    (marks / "go").write_text("")
    assert settle(proc, stay)["state"] == "done"
    wait_gone(marks, stay, ("setsid", "session"))
