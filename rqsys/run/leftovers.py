"""Ending what a run left behind: the processes that outlive its script, found by its marks.

The queue daemon is a child subreaper (``become_subreaper``, called by
``rqsys.daemon.main``): a script's descendant whose parent exits is
reparented to the daemon, not to init, so all a script started stays in the
daemon's process tree.  Once a run's script is reaped (``children``, which
signals its process group first), the daemon's children that are not running
scripts are looked at, and their descendants.  One small read lists them
(``/proc/<pid>/task/<tid>/children``, kept open, ``pread``): after most
runs they are all running scripts, and that is the whole cost.

A process carries the run's marks when (a) its session is the script's
(the script leads a session: its sid is the script's pid, and whatever did
not call setsid() stays in it), or (b) the environment it was exec'd with
(``/proc/<pid>/environ``) holds the run's ``RQ_MSG_ID`` (``environment``), which
a setsid'd process keeps.  A marked process and all its descendants get
SIGTERM (but those the group's TERM reached) through pidfds (a reused pid is
never hit), watched in the loop's selector (the daemon does not go idle
while one lives) and reaped with ``waitid`` on that pidfd once readable:
never a wildcard wait, which could take a running script.  stop_grace later
(the runner's deadlines) the rest get SIGKILL, the marks looked for again (a
fork during the first walk).  The log names what a sweep ended.  A running
run's process (its session or RQ_MSG_ID) is left alone, with what is below
it; an unmarked one is looked into.  One in the run's own sub-cgroup or
scope (``limits``) is left to that cgroup's stop, only reaped here.
Zombie children outside the daemon's session (orphans that exited while
their run went on; never a script, nor a subprocess of the daemon's) are
reaped at each run's end and each leftover's.  Scripts are the daemon's
children too when the fork server started them (``rqsys.run.forkserver``):
the server and the child it is starting are not looked at, and the
server's answers are taken first (a script that started, and maybe ended,
before its answer was read is then running, not an orphan); a child is
asked about again before it is reaped or signalled (``_started``).

What escapes: a process with no mark when its run ends and no marked one
between it and the daemon: it left the session (setsid, ``setsid -f``, a
daemon's double fork) *and* was exec'd without the run's RQ_MSG_ID (``env
-i``, ``env -u``, a login shell, sudo's env_reset), and so did each parent
of it up to the daemon (``setsid env -i sleep 9 &`` in the script itself:
orphaned, the daemon's child, unmarked).  Never seen: a process another
service started for the script (``systemd-run``, at, cron, D-Bus
activation, a container runtime, ssh), and a run's leftovers once its
daemon died (killed: they go to init; under systemd KillMode=mixed ends
them).  Another user's process may hide its environment (only its session
marks it) and refuse a signal (said in the log).  One that ignores SIGTERM
outlives a daemon that exits before its stop_grace ends, unless the stop
calls ``kill_now``.  Without the subreaper (a daemon in a test's process)
nothing is swept: orphans go to init.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rqsys.daemon.context import QueueContext
from rqsys.observe.events import EventLog
from rqsys.run.procs import Stat, children_of, in_run_cgroup, msg_id_of, read_proc, stat_of

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
WALK_MAX = 10_000  # processes looked at in one sweep: a fork bomb does not hold the loop long
NAMED_MAX = 12  # processes a log line names; the rest are counted
READ_SIZE = 4096  # the daemon's children list: 128 scripts take about 1 KiB

After = Callable[[float, Callable[[], None]], None]  # the runner's Deadlines.after
Running = Callable[[], Iterable[tuple[int, str]]]  # the running scripts: (pid, msg_id)
Starting = Callable[[list[int]], set[int]]  # of these, the fork server's children


def become_subreaper() -> bool:
    """Make this process a child subreaper (False: the kernel refused)."""
    return int(ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    done = ctypes.CDLL(None).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return int(done) == 0 and flag.value != 0


# ------------------------------------------------------------ the sweeps
@dataclass
class _Run:
    """An ended run whose leftovers were signalled: its marks."""

    msg_id: str
    sid: int


@dataclass
class _Proc:
    """A leftover whose pidfd is watched until it has ended (and been reaped)."""

    pid: int
    comm: str
    starttime: int
    run: _Run | None  # None: in its run's cgroup, ended by that cgroup's stop


RUN, OTHER, NOBODY = "run", "other", ""  # whose a process is, by its marks


class Leftovers:
    """The daemon's orphans: each run's ended at its end; zombies reaped."""

    def __init__(self, ctx: QueueContext, selector: selectors.BaseSelector, log: EventLog,
                 after: After, running: Running, starting: Starting | None = None) -> None:
        """``starting``: the fork server's children (``Starts.children``)."""
        self.ctx, self.selector, self.log = ctx, selector, log
        self.after, self.running, self.starting = after, running, starting
        self._watched: dict[int, _Proc] = {}  # pidfd -> its process
        self._by_pid: dict[int, int] = {}  # pid -> pidfd, of the watched
        self._zombies_due = False
        self._own_session = os.getsid(0)
        self._children = self._open_children() if is_subreaper() else -1

    def _open_children(self) -> int:
        path = f"/proc/self/task/{os.getpid()}/children"  # orphans go to the main thread
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            self.log.event("warning", f"what runs leave behind is not swept: {path}: "
                           f"{exc.strerror} (a kernel without CONFIG_PROC_CHILDREN?)")
            return -1

    def run_ended(self, pid: int, msg_id: str) -> None:
        """The run's script (``pid``) has been reaped: TERM what it left behind
        (KILL after stop_grace), reap the zombies among the daemon's children."""
        if self._children < 0 or pid <= 0:
            return  # no subreaper, or a hand-over (no process)
        others = self._others()
        if not others:
            return  # the common case: one small read
        run = _Run(msg_id, pid)
        ended, failed = self._sweep(others, run, signal.SIGTERM)
        if ended or failed:
            self.log.event("script", _told(f"ended {_count(ended)} the run left behind",
                                           ended, failed), msg_id)
        if ended:
            self.after(float(self.ctx.config["stop_grace"]), lambda: self._escalate(run))

    def kill_now(self) -> None:
        """SIGKILL every leftover told to stop and still waited for (the daemon
        stops before their stop_grace ends)."""
        for fd, proc in self._watched.items():
            if proc.run is not None:
                _hit(fd, signal.SIGKILL)

    def _others(self) -> list[int]:
        """The daemon's children that are not running scripts."""
        size = READ_SIZE
        while len(data := os.pread(self._children, size, 0)) >= size:
            size *= 4  # thousands of orphans: read again, all of it
        if not data:
            return []
        kids = [int(word) for word in data.split()]
        running = {pid for pid, _ in self.running()}
        others = [pid for pid in kids if pid not in running]
        if others and self.starting is not None:  # the server's, or a script it just started?
            busy = self.starting(others)  # maybe its answers taken: more are running now
            running = {pid for pid, _ in self.running()} | busy
            others = [pid for pid in kids if pid not in running]
        return others

    def _sweep(self, others: list[int], run: _Run, sig: int
               ) -> tuple[list[_Proc], list[tuple[_Proc, str]]]:
        """Find the run's processes under ``others`` and signal them, with their
        descendants; reap the zombie children on the way."""
        running = dict(self.running())
        stack: list[tuple[int, bool]] = [(pid, True) for pid in others]
        roots: list[Stat] = []
        seen = 0
        while stack and seen < WALK_MAX:
            pid, direct = stack.pop()
            seen += 1
            stat = stat_of(pid)
            if stat is None or (direct and stat.session == self._own_session):
                continue  # gone, or the daemon's own (a thread's subprocess)
            if stat.state == "Z":
                if direct and not self._started(pid):
                    _reap(pid)
                continue  # else its parent's to reap
            owner = self._owner(stat, run, running)
            if owner == RUN and not (direct and self._started(pid)):
                roots.append(stat)
            elif owner == NOBODY:
                stack.extend((kid, False) for kid in children_of(stat))
        return self._signal(roots, run, sig)

    def _started(self, pid: int) -> bool:
        """Whether a child taken for an orphan is a script the fork server
        started, asked again before it is reaped or signalled.  The kernel
        lists a child a moment before it writes the child's pid in the
        server's page, so a script can be among ``_others`` unclaimed (seen:
        one that ran and ended in that moment, reaped here, its start then
        answered for a pid gone).  Once it has run, the page names it, or
        its answer is written (taken now: it is running)."""
        if self.starting is None:
            return False
        return pid in self.starting([pid]) or any(p == pid for p, _ in self.running())

    def _owner(self, stat: Stat, run: _Run, running: dict[int, str]) -> str:
        """RUN: the process carries the run's marks; OTHER: a running run's; else NOBODY.
        A mark a running run shares (its script took the pid that was the
        ended one's sid, or the message runs again) is not the ended run's."""
        if stat.session == run.sid and run.sid not in running:
            return RUN
        if stat.session in running:
            return OTHER
        msg_id = msg_id_of(read_proc(f"/proc/{stat.pid}/environ") or b"")
        if msg_id is None:
            return NOBODY
        if msg_id in running.values():
            return OTHER
        return RUN if msg_id == run.msg_id else NOBODY

    def _signal(self, roots: list[Stat], run: _Run, sig: int
                ) -> tuple[list[_Proc], list[tuple[_Proc, str]]]:
        """Each root with its descendants (all listed before any is signalled)."""
        hit: dict[int, _Proc] = {}  # pidfd -> its process, in the order signalled
        failed: list[tuple[_Proc, str]] = []
        for root in roots:
            cgroup = read_proc(f"/proc/{root.pid}/cgroup") or b""
            contained = in_run_cgroup(cgroup, self.ctx.name, run.msg_id)
            for stat in _tree(root):
                fd = self._watch(stat, None if contained else run)
                if fd is None or contained:
                    continue
                told = sig == signal.SIGTERM and stat.pgrp == run.sid  # by the group's TERM
                why = "" if told else _hit(fd, sig)
                if why:
                    failed.append((self._watched[fd], why))
                else:
                    hit[fd] = self._watched[fd]
        return list(hit.values()), failed

    def _watch(self, stat: Stat, run: _Run | None) -> int | None:
        """The process's pidfd, watched in the selector until it ends (None: gone)."""
        fd = self._by_pid.get(stat.pid)
        if fd is not None and self._watched[fd].starttime == stat.starttime:
            self._watched[fd].run = self._watched[fd].run or run
            return fd
        try:
            fd = os.pidfd_open(stat.pid)
        except OSError:
            return None
        again = stat_of(stat.pid)
        if again is None or again.starttime != stat.starttime:  # the pid is another's now
            os.close(fd)
            return None
        self._watched[fd] = _Proc(stat.pid, stat.comm, stat.starttime, run)
        self._by_pid[stat.pid] = fd
        self.selector.register(fd, selectors.EVENT_READ, self._exited)
        return fd

    def _escalate(self, run: _Run) -> None:
        """stop_grace after the TERM: KILL the run's leftovers still there, and
        any process carrying its marks now."""
        still = [(fd, proc) for fd, proc in self._watched.items()
                 if proc.run is run and _alive(proc)]
        for fd, _proc in still:
            _hit(fd, signal.SIGKILL)
        late, failed = self._sweep(self._others(), run, signal.SIGKILL)
        killed = {id(proc): proc for proc in [proc for _fd, proc in still] + late}
        if killed or failed:
            grace = f"{float(self.ctx.config['stop_grace']):g} s"
            procs = list(killed.values())
            self.log.event("script", _told(f"killed {_count(procs)} the run left behind, "
                                           f"still there after stop_grace ({grace})",
                                           procs, failed), run.msg_id)

    def _exited(self, key: selectors.SelectorKey, _mask: int) -> None:
        """A watched leftover has ended: reaped when the daemon's child, and the
        zombies it leaves (its children, now the daemon's) soon after."""
        fd = key.fd
        self.selector.unregister(fd)
        proc = self._watched.pop(fd)
        if self._by_pid.get(proc.pid) == fd:
            del self._by_pid[proc.pid]
        with contextlib.suppress(ChildProcessError):  # not our child: its parent's to reap
            os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
        os.close(fd)
        if not self._zombies_due:
            self._zombies_due = True
            self.after(0.0, self._reap_zombies)  # once, later in this turn

    def _reap_zombies(self) -> None:
        self._zombies_due = False
        for pid in self._others():
            stat = stat_of(pid)
            if (stat is not None and stat.state == "Z" and stat.session != self._own_session
                    and not self._started(pid)):
                _reap(pid)


def _tree(root: Stat) -> list[Stat]:
    """A process and its live descendants."""
    tree: list[Stat] = []
    stack = [root]
    while stack and len(tree) < WALK_MAX:
        stat = stack.pop()
        tree.append(stat)
        stack.extend(kid for pid in children_of(stat)
                     if (kid := stat_of(pid)) is not None and kid.state != "Z")
    return tree


def _hit(pidfd: int, sig: int) -> str:
    """Signal through a pidfd: "" when sent (or the process has ended), else why not."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return ""
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def _alive(proc: _Proc) -> bool:
    stat = stat_of(proc.pid)
    return stat is not None and stat.starttime == proc.starttime and stat.state != "Z"


def _reap(pid: int) -> None:
    """A zombie child of the daemon's, by its pid (which it keeps until reaped)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _count(procs: list[_Proc]) -> str:
    return f"{len(procs)} process{'' if len(procs) == 1 else 'es'}"


def _told(head: str, procs: list[_Proc], failed: list[tuple[_Proc, str]]) -> str:
    """``head: pid 123 (sleep), ...``, and what could not be signalled."""
    told = []
    if procs:
        named = [f"pid {p.pid} ({p.comm})" for p in procs[:NAMED_MAX]]
        if len(procs) > NAMED_MAX:
            named.append(f"and {len(procs) - NAMED_MAX} more")
        told.append(f"{head}: {', '.join(named)}")
    if failed:
        told.append("could not signal what the run left behind: " + ", ".join(
            f"pid {p.pid} ({p.comm}): {why}" for p, why in failed[:NAMED_MAX]))
    return "; ".join(told)
